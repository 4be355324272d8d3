"""A tiny random ChatTTS 0.2.5, built offline: the real loading and inference code on a pool with no weights.

Its audio is noise; what it proves is that ``chattts.load_chattts`` (``Chat().load(source="custom")``)
and ``chat.infer`` run on a folder laid out like the real model's (``asset/*.safetensors``,
``asset/gpt/``, ``asset/tokenizer/``). The shapes are shrunk (one layer each, GPT hidden size 64),
so the folder carries ``mediafarm-chattts.json``: the config it was built with and the sha256 of
each file, which the loader applies in place of the package's own (a real model needs neither).
~34 MB; loads in well under a second.

Needs ChatTTS, transformers and safetensors (test-only use). Run by hand:
``python -m tests.support.tiny_chattts <folder>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

MANIFEST = "mediafarm-chattts.json"
HIDDEN = 64
# What ChatTTS's prompts and its tokenizer wrapper name; each must be one token.
SPECIAL = [
    "[spk_emb]", "[empty_spk]", "[Stts]", "[Ptts]", "[Sbreak]", "[Pbreak]", "[Ebreak]", "[uv_break]", "[v_break]",
    "[lbreak]", "[laugh]", *(f"[break_{i}]" for i in range(8)), *(f"[speed_{i}]" for i in range(10)),
    *(f"[oral_{i}]" for i in range(10)), *(f"[laugh_{i}]" for i in range(3)),
]  # fmt: skip
# Enough word pieces that any English text tokenizes: letters as words and as continuations.
LETTERS = "abcdefghijklmnopqrstuvwxyz"
PUNCTUATION = list(".,!?;:'\"-()") + [str(d) for d in range(10)]

# The shrunk shapes. The GPT's hidden states (64) are read by the decoder as 2 x 32 channels.
CONFIG: dict[str, Any] = {
    "gpt": {"hidden_size": HIDDEN, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1},
    "embed": {"hidden_size": HIDDEN},
    "decoder": {"idim": HIDDEN // 2, "odim": HIDDEN // 2, "hidden": 32, "n_layer": 1, "bn_dim": 16},
    "dvae": {
        "encoder": {"idim": HIDDEN // 2, "odim": HIDDEN, "hidden": 32, "n_layer": 1, "bn_dim": 16},
        "decoder": {"idim": HIDDEN // 2, "odim": HIDDEN // 2, "hidden": 32, "n_layer": 1, "bn_dim": 16},
        "vq": {"dim": HIDDEN},
    },
    "vocos": {
        "backbone": {"init_args": {"dim": 32, "intermediate_dim": 64, "num_layers": 1}},
        "head": {"init_args": {"dim": 32}},
    },
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tokenizer(folder: Path) -> int:
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *SPECIAL, *LETTERS, *(f"##{c}" for c in LETTERS),
             *PUNCTUATION]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    vocab_file = folder / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab_file), do_lower_case=True, additional_special_tokens=SPECIAL)
    tokenizer.save_pretrained(str(folder))
    vocab_file.unlink(missing_ok=True)
    # transformers 5 no longer writes it; ChatTTS's asset check wants it.
    special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
               "mask_token": "[MASK]", "additional_special_tokens": SPECIAL}  # fmt: skip
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    return len(tokenizer)


def build_tiny_chattts(folder: Path) -> Path:
    """Build the model in ``folder`` (created if needed) and return it. Deterministic (seed 0)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from dataclasses import asdict

    import numpy as np
    import pybase16384 as b14
    import torch
    from ChatTTS.config import Config
    from ChatTTS.model import DVAE, Embed
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    from mediafarm.tasks.families.tts.chattts import apply_overrides

    folder = Path(folder).resolve()
    asset = folder / "asset"
    torch.manual_seed(0)
    vocab_size = _tokenizer(asset / "tokenizer")
    config = json.loads(json.dumps(CONFIG))
    config["gpt"]["num_text_tokens"] = config["embed"]["num_text_tokens"] = vocab_size
    std_mean = np.concatenate([np.full(HIDDEN, 0.5), np.zeros(HIDDEN)]).astype(np.float16)
    config["spk_stat"] = b14.encode_to_string(std_mean.tobytes())

    shaped = apply_overrides(Config(), config)

    def save(module: torch.nn.Module, name: str) -> None:
        state = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
        save_file(state, str(asset / name))

    vocos_cfg = shaped.vocos
    vocos = Vocos(
        feature_extractor=instantiate_class(args=(), init=asdict(vocos_cfg.feature_extractor)),
        backbone=instantiate_class(args=(), init=asdict(vocos_cfg.backbone)),
        head=instantiate_class(args=(), init=asdict(vocos_cfg.head)),
    )
    save(vocos, "Vocos.safetensors")
    dvae = DVAE(decoder_config=asdict(shaped.dvae.decoder), encoder_config=asdict(shaped.dvae.encoder),
                vq_config=asdict(shaped.dvae.vq), dim=shaped.dvae.decoder.idim)  # fmt: skip
    save(dvae, "DVAE.safetensors")
    save(DVAE(decoder_config=asdict(shaped.decoder), dim=shaped.decoder.idim), "Decoder.safetensors")
    g = shaped.gpt
    save(Embed(g.hidden_size, g.num_audio_tokens, g.num_text_tokens, g.num_vq), "Embed.safetensors")
    llama = LlamaModel(
        LlamaConfig(hidden_size=g.hidden_size, intermediate_size=g.intermediate_size,
                    num_attention_heads=g.num_attention_heads, num_hidden_layers=g.num_hidden_layers,
                    max_position_embeddings=g.max_position_embeddings, vocab_size=8)
    )  # fmt: skip
    llama.save_pretrained(str(asset / "gpt"))

    sha256 = {
        "sha256_asset_" + str(path.relative_to(asset)).replace("/", "_").replace(".", "_"): _sha256(path)
        for path in sorted(asset.rglob("*")) if path.is_file()
    }  # fmt: skip
    (folder / MANIFEST).write_text(json.dumps({"config": config, "sha256": sha256}, indent=1))
    return folder


def ensure_tiny_chattts(folder: Path) -> Path:
    """The tiny model at ``folder``, built on first use (a test session builds it once)."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        build_tiny_chattts(folder)
    return folder


if __name__ == "__main__":
    print(build_tiny_chattts(Path(sys.argv[1])))

# One image for every mediafarm service; pools differ by the extras they install and their command.
#   docker build --build-arg EXTRAS=vad,flower -t mediafarm:cpu .
#   docker build --build-arg EXTRAS=all -t mediafarm:gpu .
# pip installs from its own configured index. An operator who uses another passes it as a build
# argument: PIP_INDEX_URL / PIP_EXTRA_INDEX_URL for every package, TORCH_INDEX_URL for torch and
# torchvision alone (a CPU-only wheel index keeps a CPU image small; the default torch is a CUDA
# build of several GB, which GPU pools need).
FROM python:3.11-slim

ARG EXTRAS=vad,embedded,flower
# pip reads these itself, and ignores them while they are empty.
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG TORCH_INDEX_URL=
# torch with its own torchvision (ultralytics needs the pair; ChatTTS's torchaudio needs torch >= 2.11).
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1

RUN apt-get update \
 && apt-get install -y --no-install-recommends espeak-ng \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# torch first and pinned: silero-vad depends on it and an unpinned resolve pulls a multi-GB build.
RUN PIP_INDEX_URL="${TORCH_INDEX_URL:-$PIP_INDEX_URL}" \
    pip install --no-cache-dir "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"
COPY pyproject.toml README.md ./
COPY mediafarm ./mediafarm
COPY config ./config
COPY tasks ./tasks
COPY workers ./workers
COPY gateway ./gateway
RUN pip install --no-cache-dir ".[${EXTRAS}]"

# Glibc arenas multiply RSS in threaded children (the TTS story's saw-tooth).
ENV MALLOC_ARENA_MAX=2 \
    FARM_MEDIA_ROOTS=/media \
    FARM_STORAGE_DIR=/storage \
    FARM_MODELS_DIR=/models
RUN useradd --create-home --uid 1000 farm && mkdir -p /media /storage /models && chown farm /storage
USER farm
ENTRYPOINT ["farm"]
CMD ["worker", "--pool", "cpu"]

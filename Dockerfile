# One image for every mediafarm service; pools differ by the extras they install and their command.
#   docker build --build-arg EXTRAS=cpu --build-arg TORCH_VERSION= --build-arg NO_DEPS=silero-vad==6.2.3 -t mediafarm:cpu .
#   docker build --build-arg EXTRAS=all -t mediafarm:gpu .
# (docker-compose.yml passes these.) pip installs from its own configured index. An operator who uses
# another passes it as a build argument: PIP_INDEX_URL / PIP_EXTRA_INDEX_URL for every package,
# TORCH_INDEX_URL for torch and torchvision alone (a CPU-only wheel index keeps an image with torch
# small; the default torch is a CUDA build of several GB, which GPU pools need).
FROM python:3.11-slim

ARG EXTRAS=vad,embedded,flower
# pip reads these itself, and ignores them while they are empty.
ARG PIP_INDEX_URL=
ARG PIP_EXTRA_INDEX_URL=
ARG TORCH_INDEX_URL=
# torch with its own torchvision (ultralytics needs the pair; ChatTTS's torchaudio needs torch >= 2.11).
# Empty TORCH_VERSION: no torch (the cpu extra needs none).
ARG TORCH_VERSION=2.14.1
ARG TORCHVISION_VERSION=0.29.1
# Requirements installed without their dependencies, after the extras: silero-vad for the CPU image,
# whose declared torch its ONNX model does not need.
ARG NO_DEPS=

# No apt step: the espeak rung speaks with the espeakng-loader wheel (the tts and cpu extras).

# torch first and pinned: silero-vad depends on it and an unpinned resolve pulls a multi-GB build.
RUN if [ -n "$TORCH_VERSION" ]; then \
      PIP_INDEX_URL="${TORCH_INDEX_URL:-$PIP_INDEX_URL}" \
      pip install --no-cache-dir "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}"; \
    fi
# The source is built from /tmp/src and removed: a working folder holding the source's mediafarm/
# would shadow the installed package (Celery and python put the working folder first on sys.path,
# and mediafarm/ there has only __init__.py: "No module named 'mediafarm.tasks'").
# Dependencies first, from pyproject.toml alone (its packages as empty folders), so that a change to
# the source rebuilds only the last, small layer.
COPY pyproject.toml README.md scripts/package_skeleton.py /tmp/src/
RUN python /tmp/src/package_skeleton.py /tmp/src \
 && pip install --no-cache-dir "/tmp/src[${EXTRAS}]" \
 && if [ -n "$NO_DEPS" ]; then pip install --no-cache-dir --no-deps $NO_DEPS; fi \
 && pip uninstall -y -q mediafarm && rm -rf /tmp/src
COPY mediafarm /tmp/src/mediafarm
COPY config /tmp/src/config
COPY tasks /tmp/src/tasks
COPY workers /tmp/src/workers
COPY gateway /tmp/src/gateway
COPY pyproject.toml README.md /tmp/src/
RUN pip install --no-cache-dir --no-deps /tmp/src && rm -rf /tmp/src

# Glibc arenas multiply RSS in threaded children (the TTS story's saw-tooth).
ENV MALLOC_ARENA_MAX=2 \
    FARM_MEDIA_ROOTS=/media \
    FARM_STORAGE_DIR=/storage \
    FARM_MODELS_DIR=/models
RUN useradd --create-home --uid 1000 farm && mkdir -p /media /storage /models && chown farm /storage
USER farm
WORKDIR /home/farm
ENTRYPOINT ["farm"]
CMD ["worker", "--pool", "cpu"]

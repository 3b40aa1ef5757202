# syntax=docker/dockerfile:1
# convgate's two images, one Dockerfile:
#
#   --target api     the control plane: `convgate serve`, `convgate db upgrade` (FastAPI, SQLAlchemy, psycopg,
#                    alembic, the Kubernetes client). No torch, no llama.cpp.
#   --target worker  the verification engine: `convgate verify`, `convgate worker run` (torch CPU, transformers,
#                    llama-cpp-python with portable CPU flags, gguf, safetensors, tokenizers, sentencepiece).
#
# Both run as uid/gid 10001 on a read-only root filesystem: every cache and temporary file goes under
# /scratch, which the pod mounts (an emptyDir; the chart and the Job manifest do). No wheel stays in a
# layer: pip's cache is a cache mount and the venv is built in a builder stage and copied.
#
# Build arguments (docs/deploy.md):
#   BASE         a Debian bookworm image with python3.11 (python3.11 may live in /usr/local/bin, as in the
#                official image, or /usr/bin, as in the offline base scripts/build_images.py makes).
#                Default: the official python:3.11-slim-bookworm (3.11.10) pinned by digest; the digest is
#                the published one quoted by public Dockerfiles pinning that tag, e.g. the Renovate-kept
#                list in github.com/nalabelle/build (images/digests.Dockerfile).
#   TORCH_INDEX  the pip index torch comes from; the default CPU index keeps CUDA's libraries out.
#   LLAMA_CMAKE_ARGS  how llama.cpp is compiled when no prebuilt wheel is given: portable x86-64 with AVX2,
#                no -march=native, no AVX-512 or AMX (a node's CPU may lack them or a VM may trap them).
# Named build context (docker buildx, buildah and podman all take --build-context):
#   llama-wheels a folder holding a llama-cpp-python wheel built with the same flags (dev.py keeps one);
#                given, it is installed instead of compiling llama.cpp (7-11 minutes on 2 cores).
#
#   docker buildx build --target worker -t convgate-worker .
#   buildah bud --layers --target api -t convgate-api .

ARG BASE=python:3.11.10-slim-bookworm@sha256:5148c0e4bbb64271bca1d3322360ebf4bfb7564507ae32dd639322e4952a6b16

# Empty unless replaced with `--build-context llama-wheels=DIR`.
FROM scratch AS llama-wheels

# A virtual environment at /opt/convgate, made by whichever python3.11 the base has; every later stage
# that runs it starts FROM the same base, so its interpreter symlink resolves.
FROM ${BASE} AS venv
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    python3.11 -m venv /opt/convgate \
 && /opt/convgate/bin/pip install --upgrade pip
COPY scripts/image_requirements.py /usr/local/lib/convgate-build/image_requirements.py

# The api's dependencies, from pyproject.toml alone: a source change reuses this layer. The control plane
# must stay small (under 300 MB), so what it never runs goes: the Kubernetes client's asyncio twin
# (kubernetes.aio, ~70 MB; service/dispatch uses the synchronous client), numpy's test suites, pip and
# setuptools (nothing is installed at run time), the debug symbols of the extension modules (~30 MB), and
# the bytecode (~70 MB: pip --no-compile; a pod compiles what it imports when it starts, a few seconds).
FROM venv AS api-deps
RUN apt-get update && apt-get install -y --no-install-recommends binutils && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml /src/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    /opt/convgate/bin/python /usr/local/lib/convgate-build/image_requirements.py /src/pyproject.toml api \
      > /src/requirements.txt \
 && /opt/convgate/bin/pip install --no-compile -r /src/requirements.txt \
 && site=/opt/convgate/lib/python3.11/site-packages \
 && rm -rf "$site/kubernetes/aio" \
 && find "$site/numpy" -depth -type d -name tests -exec rm -rf {} + \
 && find "$site" -name '*.so' -not -path '*.libs/*' -exec strip --strip-unneeded {} + \
 && /opt/convgate/bin/python -m pip uninstall --yes --quiet pip setuptools \
 && find /opt/convgate -depth -type d -name __pycache__ -exec rm -rf {} +

# The worker's dependencies: torch from TORCH_INDEX first, then llama-cpp-python (the given wheel, or
# compiled here with LLAMA_CMAKE_ARGS), then the rest from PyPI.
FROM venv AS worker-deps
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
COPY pyproject.toml /src/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    /opt/convgate/bin/python /usr/local/lib/convgate-build/image_requirements.py /src/pyproject.toml worker \
      > /src/requirements.txt \
 && /opt/convgate/bin/pip install --index-url "$TORCH_INDEX" "$(grep '^torch[<>=]' /src/requirements.txt)"
# Copied, not bind-mounted: a COPY's cache key is its content, so giving, changing or leaving out the
# wheel rebuilds what follows (a RUN's key ignores what its mounts hold). This stage is never shipped.
COPY --from=llama-wheels / /tmp/llama-wheels/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    set -eu \
 && pip=/opt/convgate/bin/pip \
 && wheel="$(ls /tmp/llama-wheels/llama_cpp_python-*.whl 2>/dev/null | head -n 1 || true)" \
 && if [ -z "$wheel" ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends build-essential cmake \
      && CMAKE_ARGS="$LLAMA_CMAKE_ARGS" FORCE_CMAKE=1 $pip wheel --no-deps --no-cache-dir --wheel-dir /tmp/llama \
           "$(grep '^llama-cpp-python' /src/requirements.txt)" \
      && wheel="$(ls /tmp/llama/llama_cpp_python-*.whl)"; \
    fi \
 && $pip install "$wheel" -r /src/requirements.txt \
 && rm -rf /tmp/llama /tmp/llama-wheels

# convgate itself, installed without dependencies under /staged (the same /opt/convgate paths), so the
# images take it as one small layer on top of their dependencies.
FROM venv AS project
COPY pyproject.toml README.md /src/
COPY engine /src/engine
COPY service /src/service
COPY edge /src/edge
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    /opt/convgate/bin/pip install --no-deps --no-warn-script-location --root /staged /src

# What both images share: the user, the scratch mount point, where every cache goes.
FROM ${BASE} AS runtime
RUN groupadd --gid 10001 convgate \
 && useradd --uid 10001 --gid 10001 --home-dir /scratch/home --no-create-home \
      --shell /usr/sbin/nologin convgate \
 && mkdir -p /scratch && chown 10001:10001 /scratch
# Every writer points under /scratch (the pod's volume); the root filesystem stays read-only.
ENV PATH=/opt/convgate/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/scratch/home \
    TMPDIR=/scratch/tmp \
    XDG_CACHE_HOME=/scratch/xdg-cache \
    CONVGATE_CACHE_DIR=/scratch/cache \
    CONVGATE_CACHE=/scratch/cache \
    CONVGATE_ALEMBIC_INI=/app/alembic.ini \
    HF_HOME=/scratch/hf \
    HF_HUB_DISABLE_TELEMETRY=1 \
    TORCH_HOME=/scratch/torch \
    TRITON_CACHE_DIR=/scratch/triton \
    NUMBA_CACHE_DIR=/scratch/numba \
    MPLCONFIGDIR=/scratch/matplotlib
WORKDIR /app

FROM runtime AS api
COPY --from=api-deps /opt/convgate /opt/convgate
COPY --from=project /staged/ /
# Alembic needs its script directory and ini side by side (service/persistence/migrate.py).
COPY alembic.ini /app/alembic.ini
COPY migrations /app/migrations
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["convgate"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--no-migrate"]

FROM runtime AS worker
# llama.cpp's OpenMP runtime and the CA store (the official slim base has neither; the offline base has both).
RUN if [ "$(dpkg-query -W -f '${Status}\n' libgomp1 ca-certificates 2>/dev/null | grep -c 'ok installed')" != 2 ]; then \
      apt-get update \
      && apt-get install -y --no-install-recommends libgomp1 ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=worker-deps /opt/convgate /opt/convgate
COPY --from=project /staged/ /
USER 10001:10001
ENTRYPOINT ["convgate"]
CMD ["--help"]

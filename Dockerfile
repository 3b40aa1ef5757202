# syntax=docker/dockerfile:1
# One image for the API and the worker. Stage 1 builds every wheel (llama-cpp-python compiles
# llama.cpp for the CPU; torch comes from the CPU-only index), stage 2 installs them into a slim,
# non-root runtime with nothing to compile.

FROM python:3.11-slim-bookworm AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY worker ./worker
COPY service ./service
RUN pip install --no-cache-dir --upgrade pip \
 && pip wheel --no-cache-dir --wheel-dir /wheels \
      --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" \
 && CMAKE_ARGS="-DGGML_NATIVE=OFF" pip wheel --no-cache-dir --wheel-dir /wheels \
      --extra-index-url https://download.pytorch.org/whl/cpu ".[runtime]"

FROM python:3.11-slim-bookworm AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 10001 convgate \
 && useradd --uid 10001 --gid 10001 --home-dir /scratch/home --no-create-home --shell /usr/sbin/nologin convgate
COPY --from=builder /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "convgate[runtime]" && rm -rf /wheels
WORKDIR /app
# Alembic needs its script directory and ini next to each other (service/persistence/migrate.py).
COPY alembic.ini ./
COPY migrations ./migrations
ENV CONVGATE_ALEMBIC_INI=/app/alembic.ini \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/scratch/home \
    HF_HUB_DISABLE_TELEMETRY=1
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["convgate"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--no-migrate"]

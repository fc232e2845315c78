# The SGLang worker image: the official SGLang 0.5.23 image with this project's patch set
# applied (patches/: the per-tier prefix probe and L3 KV events), built from the repository root:
#   docker build -f deploy/docker/sglang-worker.Dockerfile -t smetric-sglang-worker:0.5.23 .
# SGLANG_IMAGE must be a 0.5.23 build for your CUDA driver; the patch tool refuses any other
# SGLang release, so a wrong tag fails the build instead of shipping unpatched workers.
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23
FROM ${SGLANG_IMAGE}

# `patch` applies the patch set; Mooncake's Transfer Engine (its wheel also installs
# mooncake_master, which deploy/base/mooncake runs from this image) is pinned as the CPU
# environment pins it (Makefile, sglang target).
RUN (command -v patch >/dev/null || (apt-get update && apt-get install -y --no-install-recommends patch \
        && rm -rf /var/lib/apt/lists/*)) \
    && python3 -m pip install --no-cache-dir mooncake-transfer-engine==0.3.13.post1

COPY pyproject.toml README.md /opt/smetric-router/
COPY smetric_router /opt/smetric-router/smetric_router
COPY patches /opt/smetric-router/patches
# --no-deps: the image's own SGLang stack stays as built; only the patch tool is used from it
RUN python3 -m pip install --no-cache-dir --no-deps /opt/smetric-router \
    && python3 -m smetric_router.patches apply --patch-dir /opt/smetric-router/patches \
    && python3 -m smetric_router.patches check --patch-dir /opt/smetric-router/patches

ENTRYPOINT ["python3", "-m", "sglang.launch_server"]

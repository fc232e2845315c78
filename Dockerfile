# The router image (also what deploy/overlays/cpu runs the emulated workers from):
#   docker build -t smetric-router:0.1.0 .
# Built as a wheel in a throwaway stage so the final image holds no source tree or build tools.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY smetric_router ./smetric_router
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
# A fixed uid: the manifests' runAsUser names it, and runAsNonRoot needs a numeric user.
RUN groupadd --gid 10001 smetric \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/smetric smetric
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# The router and the emulator read tokenizers from disk only; a hub download from inside a
# cluster would stall a pod's start, so it fails fast instead.
ENV HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/smetric
EXPOSE 30000
ENTRYPOINT ["smetric-router"]
CMD ["--host", "0.0.0.0"]

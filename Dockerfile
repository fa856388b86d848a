# vLLM's OpenAI server with inference-sidecar installed (plugin + sidecar CLI). GPU hosts.
# The same image runs the sidecar service (see docker-compose.yml).
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

COPY pyproject.toml README.md /src/
COPY sidecar /src/sidecar
COPY plugins /src/plugins
# vLLM and torch come with the base image; this adds the sidecar, its plugin entry points and the
# OpenTelemetry/NVML dependencies.
RUN pip install --no-cache-dir /src

ENTRYPOINT ["python3", "-m", "vllm.entrypoints.openai.api_server"]

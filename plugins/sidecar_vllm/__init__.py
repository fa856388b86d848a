"""inference-sidecar's vLLM integration, loaded through vLLM's ``vllm.general_plugins`` entry point."""

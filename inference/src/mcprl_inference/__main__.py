"""``mcprl-inference``: serve the engine (settings from ``INFERENCE_*``; flags override)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from mcprl_common.service_app import run_service
from mcprl_inference.app import SERVICE, create_app
from mcprl_inference.settings import InferenceSettings


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mcprl-inference", description=__doc__)
    parser.add_argument("--model", help="HF id or local folder (INFERENCE_MODEL)")
    parser.add_argument("--served-model-name", help="INFERENCE_SERVED_MODEL_NAME")
    parser.add_argument("--host", help="INFERENCE_HOST")
    parser.add_argument("--port", type=int, help="INFERENCE_PORT")
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    settings = InferenceSettings(**overrides)
    run_service(create_app(settings), settings, SERVICE)


if __name__ == "__main__":
    main()

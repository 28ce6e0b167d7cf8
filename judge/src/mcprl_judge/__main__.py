"""``mcprl-judge``: serve the judge (settings from ``JUDGE_*`` env vars)."""

from __future__ import annotations

from mcprl_common.service_app import run_service
from mcprl_judge.app import SERVICE, create_app
from mcprl_judge.settings import JudgeSettings


def main() -> None:
    settings = JudgeSettings()
    run_service(create_app(settings), settings, SERVICE)


if __name__ == "__main__":
    main()

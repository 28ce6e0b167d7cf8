"""The run report people look at: ``report.html`` with curves, a trajectory browser and the
eval before and after, readable offline from the run directory."""

from mcprl_trainer.html_report.writer import (
    REPORT_NAME,
    rebuild_report,
    update_report,
    update_report_safely,
)

__all__ = ["REPORT_NAME", "rebuild_report", "update_report", "update_report_safely"]

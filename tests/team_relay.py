"""A team's own workflow that runs whatever activity its input names: the kind of generic relay
a team may keep on its worker (a retry harness, an admin tool), which anyone who can start
workflows can aim at the agents' activities on the same task queue. Imports only temporalio, so
the plugin's sandbox runs it as it runs the team's other workflows (tests/test_package_review.py).
"""

from datetime import timedelta
from typing import Any

from temporalio import workflow


@workflow.defn
class RelayWorkflow:
    @workflow.run
    async def run(self, activity: str, arg: Any) -> str:
        try:
            await workflow.execute_activity(
                activity, arg, start_to_close_timeout=timedelta(seconds=30)
            )
        except Exception as e:  # noqa: BLE001  # what failed is the answer
            cause = e.__cause__
            return f"refused: {cause.type if cause is not None else e}"  # type: ignore[attr-defined]  # ApplicationError
        return "ran"

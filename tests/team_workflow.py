"""A team's own workflow and activity, in a module of their own as Temporal's samples keep them
(workflows.py, activities.py): the sandbox imports this module for each run, so it imports
nothing but temporalio (tests/test_plugin.py hosts it beside the agents)."""

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn
async def shout(word: str) -> str:
    return word.upper() + "!"


@workflow.defn
class GreetingWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            shout, name, start_to_close_timeout=timedelta(seconds=10)
        )


@workflow.defn
class CallOne:
    """Runs one activity of the worker's by its name."""

    @workflow.run
    async def run(self, name: str) -> str:
        return await workflow.execute_activity(
            name, "hi", result_type=str, start_to_close_timeout=timedelta(seconds=10)
        )

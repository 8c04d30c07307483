"""deployAgent: deployments pause for approval and are answered by *restart*.

``ToolApproval`` gates every tool not on its allow list: ``deploy`` pauses before it runs, and a
restart with ``{"tool_approved": true}`` runs it with its original input. ``deployStatus`` is on
the allow list and runs without asking.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from temporal_agent_interrupts import Agent, ToolApproval, ToolContext, tool


class DeployInput(BaseModel):
    service: str = Field(description="The service to deploy")
    environment: str = Field(default="production", description="Target environment")
    version: str = Field(default="latest", description="Version or git ref")


class DeployOutput(BaseModel):
    deployed: bool
    service: str
    environment: str
    version: str
    deployment_id: str


class StatusInput(BaseModel):
    service: str


class StatusOutput(BaseModel):
    service: str
    version: str
    healthy: bool


DEPLOYMENTS: list[DeployOutput] = []
"""Deployments this process made; the example's stand-in for a deploy system."""


@tool("deploy", "Deploy a service to an environment.")
async def deploy(inp: DeployInput, ctx: ToolContext) -> DeployOutput:
    out = DeployOutput(
        deployed=True,
        service=inp.service,
        environment=inp.environment,
        version=inp.version,
        deployment_id=f"dep-{ctx.ref[-8:]}",
    )
    DEPLOYMENTS.append(out)
    return out


@tool("deployStatus", "Show which version of a service is running and whether it is healthy.")
async def deploy_status(inp: StatusInput) -> StatusOutput:
    latest = next((d for d in reversed(DEPLOYMENTS) if d.service == inp.service), None)
    return StatusOutput(
        service=inp.service, version=latest.version if latest else "unknown", healthy=True
    )


deploy_agent = Agent(
    "deployAgent",
    model="gemini-flash-latest",
    system="You deploy services. Use deploy to ship code and deployStatus to check on it.",
    tools=[deploy, deploy_status],
    middleware=[ToolApproval(allow=["deployStatus"])],
)

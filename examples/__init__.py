"""Example agents from the Genkit interrupt pages: banking approval, deploy restart, shell.

In the repository only, not in the package: ``make run`` and the image host them with
``--agents examples`` (``AGENT_MODULES=examples``)."""

from examples.banking import banking_agent
from examples.deploy import deploy_agent
from examples.shell import shell_agent

ALL_AGENTS = [banking_agent, deploy_agent]
"""What ``--agents examples`` hosts. Not ``shell_agent``, which runs commands on the
worker's machine: host it only on purpose (``--agents examples:shell_agent``)."""

__all__ = ["ALL_AGENTS", "banking_agent", "deploy_agent", "shell_agent"]

"""The GitHub Actions workflows are valid YAML and run the README's commands."""

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _run_steps(workflow: dict) -> str:
    return "\n".join(" ".join(step["run"].split()) for job in workflow["jobs"].values()
                     for step in job["steps"] if "run" in step)


def _readme_commands() -> list[str]:
    """The quick start's commands and the nightly gate's first command, comments stripped."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line in ("python -m fmha.ci.verify", "pytest -n auto")
            or line.startswith("python -m fmha.ci.nightly --out")]


@pytest.mark.parametrize("path", WORKFLOWS, ids=[p.name for p in WORKFLOWS])
def test_workflow_is_valid_yaml_with_jobs_and_steps(path):
    workflow = yaml.safe_load(path.read_text())
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert triggers, f"{path.name}: no trigger ('on:')"
    for name, job in workflow["jobs"].items():
        assert job.get("runs-on") and job.get("steps"), f"{path.name}: job {name} needs runs-on and steps"
        for step in job["steps"]:
            assert "run" in step or "uses" in step, f"{path.name}: job {name} has a step with neither run nor uses"


def test_the_workflows_run_the_readme_commands():
    commands = _readme_commands()
    assert len(commands) == 3, f"README commands not found where expected: {commands}"
    runs = "\n".join(_run_steps(yaml.safe_load(p.read_text())) for p in WORKFLOWS)
    runs += "\n" + (ROOT / ".ci" / "run").read_text()  # the CPU job runs .ci/run
    missing = [c for c in commands if c not in runs]
    assert not missing, f"README commands no workflow runs: {missing}"


def test_the_readme_gives_the_command_the_install_test_runs():
    """tests/test_install.py runs it from a directory holding only mykernel.py."""
    from test_install import COMMAND

    assert " ".join(COMMAND) in (ROOT / "README.md").read_text()

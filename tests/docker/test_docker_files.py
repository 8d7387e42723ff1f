"""Static checks of docker/: the Dockerfile parses, its variables are defined, its pins equal pyproject's.

No Docker engine is needed (CI has none): a small parser reads the Dockerfile the way the builder does
(line continuations, comments, one instruction per logical line).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # stdlib from Python 3.11 on

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
IGNORE_FILE = REPO / "docker" / "Dockerfile.dockerignore"

KEYWORDS = {"FROM", "RUN", "CMD", "LABEL", "MAINTAINER", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT",
            "VOLUME", "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}
# Variables the base image's environment provides (nvidia/cuda sets PATH).
INHERITED = {"PATH"}
VAR_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def parse_dockerfile(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction; continuation lines joined, comment lines dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):  # the builder also drops comments inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical = pending + line
        pending = ""
        keyword, _, args = logical.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
    if pending:
        raise ValueError(f"Dockerfile ends inside a continued line: {pending[:80]!r}")
    return instructions


def pin_arg(package: str) -> str:
    """The Dockerfile ARG holding a package's pin: hydra-core -> HYDRA_CORE_VERSION."""
    return package.upper().replace("-", "_") + "_VERSION"


def declared_names(keyword: str, args: str) -> dict[str, str]:
    """Names (and values) an ARG or ENV instruction defines."""
    tokens = shlex.split(args)
    if keyword == "ENV" and tokens and "=" not in tokens[0]:  # legacy form: ENV NAME value
        return {tokens[0]: " ".join(tokens[1:])}
    names = {}
    for tok in tokens:
        name, _, value = tok.partition("=")
        names[name] = value
    return names


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def vllm_extra_pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {}
    for req in project["optional-dependencies"]["vllm"]:
        name, sep, version = req.partition("==")
        assert sep, f"the vllm extra should pin exact versions, got {req!r}"
        pins[name.strip()] = version.strip()
    return pins


def test_parser_joins_continuations_and_drops_comments():
    text = "# c\nFROM a:b\nRUN x \\\n  # inner comment\n  && y\nenv A=1\n"
    assert parse_dockerfile(text) == [("FROM", "a:b"), ("RUN", "x && y"), ("ENV", "A=1")]
    with pytest.raises(ValueError, match="continued line"):
        parse_dockerfile("FROM a\nRUN x \\\n")


def test_only_known_keywords_and_from_first(instructions):
    assert instructions[0][0] == "FROM"
    assert [k for k, _ in instructions if k == "FROM"] == ["FROM"]  # one stage
    unknown = [k for k, _ in instructions if k not in KEYWORDS]
    assert not unknown, f"unknown Dockerfile instructions: {unknown}"
    image = instructions[0][1]
    assert image.startswith("nvidia/cuda:13.0"), "torch 2.11.0 on PyPI is built for CUDA 13.0 (+cu130)"


def test_every_variable_is_defined_before_use(instructions):
    defined = set(INHERITED)
    for keyword, args in instructions:
        if keyword in ("CMD", "ENTRYPOINT") and args.startswith("["):
            continue  # exec form: no variable expansion
        used = set(VAR_REF.findall(args))
        if keyword in ("ARG", "ENV"):
            new = declared_names(keyword, args)
            used = {u for v in new.values() for u in VAR_REF.findall(v)}
            missing = used - defined
            defined |= set(new)
        else:
            missing = used - defined
        assert not missing, f"{keyword} {args[:60]!r} uses undefined {sorted(missing)}"


def test_pins_equal_pyproject_vllm_extra(instructions, vllm_extra_pins):
    args = {}
    for keyword, text in instructions:
        if keyword == "ARG":
            args.update(declared_names(keyword, text))
    version_args = {k: v for k, v in args.items() if k.endswith("_VERSION")}
    expected = {pin_arg(name): version for name, version in vllm_extra_pins.items()}
    assert version_args == expected, "docker/Dockerfile's *_VERSION ARGs differ from pyproject's vllm extra"
    installs = " ".join(text for keyword, text in instructions if keyword == "RUN" and "pip install" in text)
    for name in vllm_extra_pins:
        assert f'"{name}==${{{pin_arg(name)}}}"' in installs, f"{name} is not installed at its pinned version"
    assert vllm_extra_pins["torch"] == "2.11.0" and vllm_extra_pins["vllm"] == "0.25.0"


def test_environment_for_cuda_ops_and_nccl(instructions):
    env = {}
    for keyword, text in instructions:
        if keyword == "ENV":
            env.update(declared_names(keyword, text))
    assert env["TORCH_CUDA_ARCH_LIST"] == "8.0 9.0"  # A100 + H100
    assert env["DS_BUILD_OPS"] == "0"
    assert env["NCCL_NVLS_ENABLE"] == "0"


def test_command_and_copied_paths_exist(instructions):
    (cmd,) = [text for keyword, text in instructions if keyword == "CMD"]
    argv = json.loads(cmd)
    assert argv[:2] == ["python", "start_pipeline.py"] and (REPO / argv[1]).is_file()
    for keyword, text in instructions:
        if keyword == "COPY":
            *sources, _dest = shlex.split(text)
            for src in sources:
                assert (REPO / src).exists(), f"COPY source {src} is missing from the repo"


def test_ignore_file_keeps_local_state_out_of_the_image():
    patterns = {line.strip() for line in IGNORE_FILE.read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "outputs", "*.egg-info"} <= patterns
    assert not patterns & {"roll_ma", "examples", "pyproject.toml", "start_pipeline.py"}

"""The FinOps Foundation's focus-validator (PyPI), run as its CLI on a CSV file: what it can check and how its
verdict is read (tests/integration/test_focus_validator.py explains each choice; the e2e test uses it too)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

VALIDATE_VERSION = "1.0"
KNOWN_GAPS = (
    "Provider_Required", "Publisher_Required", "ResourceID_Required", "SkuPriceId_Nullable",
    "CommitmentDiscountCategory_Required", "CommitmentDiscountId_Required", "CommitmentDiscountName_Required",
    "CommitmentDiscountStatus_Required", "CommitmentDiscountType_Required",
)


def validator_home() -> Path:
    """The directory to run the validator from (it reads a data file by a path relative to its package)."""
    spec = importlib.util.find_spec("focus_validator")
    if spec is None or spec.origin is None:
        pytest.fail("focus-validator is not installed: pip install -r requirements.txt")
    return Path(spec.origin).parent.parent


def validate(home: Path, data: Path, workdir: Path) -> dict[str, str]:
    """Run the validator CLI on ``data``; return {check name: passed|failed|skipped|errored}."""
    overrides = workdir / "overrides.yaml"
    overrides.write_text("overrides:\n" + "".join(f"  - {name}\n" for name in KNOWN_GAPS))
    report = workdir / f"report-{uuid.uuid4().hex}.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "focus_validator.main", "--data-file", str(data), "--validate-version",
         VALIDATE_VERSION, "--override-file", str(overrides), "--output-type", "unittest",
         "--output-destination", str(report)],
        cwd=home, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and report.exists(), proc.stdout + proc.stderr
    verdicts = {}
    for case in ET.parse(report).iter("testcase"):
        name = case.get("name").split(" :: ")[0]
        outcome = next((child.tag for child in case if child.tag in ("failure", "skipped", "error")), "passed")
        verdicts[name] = {"failure": "failed", "error": "errored"}.get(outcome, outcome)
    assert verdicts, f"empty validator report: {proc.stdout}{proc.stderr}"
    return verdicts

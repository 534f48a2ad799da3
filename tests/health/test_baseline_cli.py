"""A baseline that cannot be captured, through ``gpuguard health run`` and ``gpuguard health baseline show|reset``:
a hostile interpreter's forged figures never become the baseline, a stored poisoned one is never used, the
operator's reset is audited."""

from __future__ import annotations

import io
import json
import os
import pwd
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Tuple

import pytest

from agent.cli import main
from agent.health.model import Fingerprint
from agent.health.runner import run_health_check
from tests.health.baseline_helpers import poisoned_file, switchable_interpreter
from tests.health.helpers import FAKE_PROBE, fake_probe_settings, make_fake_nvml, make_host, make_snapshot

pytestmark = pytest.mark.timeout(120)

FORGED = "--mode pass --gemm 9.99e6"
HONEST = "--mode pass --gemm 750"
OTHER_STACK = Fingerprint(gpu_models="NVIDIA H200", driver="nvidia 570.86.15", gpu_stack="CUDA 12.8")


class Cli:
    """``gpuguard`` against one state directory, a GPU host root and a hostile interpreter the test steers."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.python, self.args = switchable_interpreter(tmp_path)
        self.root = tmp_path / "gpu-root"
        (self.root / "dev").mkdir(parents=True)
        (self.root / "dev" / "nvidia0").write_text("")
        self.config = tmp_path / "agent.toml"
        me = pwd.getpwuid(os.geteuid()).pw_name
        self.config.write_text(f'[agent]\nstate_dir = "{self.state}"\n[health]\npython = "{self.python}"\n'
                               f'timeout_seconds = 30\nrun_as = "{me}"\n')

    def __call__(self, *argv: str, modules: Optional[Dict[str, ModuleType]] = None) -> Tuple[int, str]:
        out = io.StringIO()
        mods = modules if modules is not None else {"pynvml": make_fake_nvml([[0.0], [90.0]])}
        code = main([*argv, "--config", str(self.config)], make_host=lambda _: make_host(mods, root=self.root),
                    out=out)
        return code, out.getvalue()

    def check(self, probe_args: str) -> Dict[str, object]:
        self.args.write_text(probe_args)
        code, text = self("health", "run", "--json")
        data = json.loads(text)
        assert code == {"pass": 0, "regression": 20}.get(str(data["status"]), code)
        return data

    def stored_figures(self) -> List[float]:
        path = self.state / "health" / "baselines.json"
        data = json.loads(path.read_text()) if path.exists() else {"records": {}}
        return [v for rec in data["records"].values() for run in rec["runs"] for v in run["metrics"].values()]


def test_five_forged_runs_then_an_honest_one_is_not_a_regression(tmp_path: Path) -> None:
    """Five runs forging 9.99e6 TFLOP/s never enter the baseline (corroboration fails them above the SKU's peak, so
    they never reach it); the honest run after them is no regression."""
    cli = Cli(tmp_path)
    for _ in range(5):
        forged = cli.check(FORGED)
        assert forged["status"] == "failed" and forged["baseline"] is None
        corroboration = forged["corroboration"]
        assert isinstance(corroboration, dict)
        assert [d["kind"] for d in corroboration["disagreements"]] == ["above_peak"]
    assert all(v < 1e4 for v in cli.stored_figures())
    honest = cli.check(HONEST)
    assert honest["status"] == "pass" and honest["regressions"] == []
    baseline = honest["baseline"]
    assert isinstance(baseline, dict) and baseline["recorded"] is True and baseline["own_runs"] == 1


def test_a_stored_poisoned_baseline_is_never_used_and_the_check_says_so(tmp_path: Path) -> None:
    """A baselines.json established at 9.99e6 before the fix: the honest run is a pass naming it suspicious."""
    cli = Cli(tmp_path)
    poisoned_file(cli.state / "health" / "baselines.json", OTHER_STACK.id, OTHER_STACK)
    honest = cli.check(HONEST)
    assert honest["status"] == "pass" and honest["regressions"] == []
    assert "baseline suspicious, not used" in str(honest["summary"])
    baseline = honest["baseline"]
    assert isinstance(baseline, dict) and baseline["reference_fingerprint_id"] is None
    assert baseline["suspicious"][0].startswith(f"baseline {OTHER_STACK.id} gpu0 gemm_bf16_tflops 9.99e+06 > ")


def test_show_prints_each_gpu_its_runs_and_rule(tmp_path: Path) -> None:
    """``baseline show`` prints the fingerprint, GPU, figures, runs, state and rule; --json the same as data."""
    cli = Cli(tmp_path)
    for _ in range(5):
        cli.check(HONEST)
    code, text = cli("health", "baseline", "show")
    assert code == 0
    header, row = text.splitlines()[:2]
    assert header.split() == ["fingerprint", "gpu", "figures", "runs", "state", "since", "rule"]
    assert " gpu0 " in row and "gemm_bf16_tflops 750.0" in row and " 5 " in row and "established" in row
    assert row.endswith("first_runs")
    code, text = cli("health", "baseline", "show", "--json")
    data = json.loads(text)
    assert code == 0 and data["suspicious"] == []
    (view,) = data["baselines"]
    assert (view["scope"], view["runs"], view["established"], view["rule"]) == ("gpu0", 5, True, "first_runs")
    assert view["figures"] == {"gpu0.copy_bandwidth_gbps": 4200.0, "gpu0.gemm_bf16_tflops": 750.0}


def test_show_names_a_suspicious_baseline(tmp_path: Path) -> None:
    """``baseline show`` names the stored figures beyond the SKU limits."""
    cli = Cli(tmp_path)
    poisoned_file(cli.state / "health" / "baselines.json", OTHER_STACK.id, OTHER_STACK)
    code, text = cli("health", "baseline", "show")
    assert code == 0
    assert f"SUSPICIOUS (never compared with; gpuguard health baseline reset): baseline {OTHER_STACK.id} gpu0 " \
           "gemm_bf16_tflops 9.99e+06" in text


def test_reset_clears_the_baselines_and_writes_an_audit_line(tmp_path: Path) -> None:
    """``baseline reset`` empties the store and appends health_baseline_reset (who, what was cleared) to audit.log."""
    cli = Cli(tmp_path)
    poisoned_file(cli.state / "health" / "baselines.json", OTHER_STACK.id, OTHER_STACK)
    code, text = cli("health", "baseline", "reset", "--reason", "poisoned before 39")
    assert code == 0 and text.startswith("reset every baseline (1 cleared)")
    assert cli.stored_figures() == []
    (line,) = (cli.state / "audit.log").read_text().splitlines()
    entry = json.loads(line)
    assert entry["event"] == "health_baseline_reset" and entry["gpu"] is None
    assert entry["reason"] == "poisoned before 39" and entry["by"] == pwd.getpwuid(os.geteuid()).pw_name
    assert entry["cleared"][0]["figures"]["gpu0.gemm_bf16_tflops"] == 9.99e6
    code, text = cli("health", "baseline", "show")
    assert "last reset of every baseline" in text and "SUSPICIOUS" not in text


def test_reset_of_one_gpu_is_learned_again(tmp_path: Path) -> None:
    """``reset --gpu 0`` drops GPU 0's figures from an established baseline; the next runs learn them again."""
    cli = Cli(tmp_path)
    for _ in range(5):
        cli.check(HONEST)
    code, _ = cli("health", "baseline", "reset", "--gpu", "0")
    assert code == 0
    entry = json.loads((cli.state / "audit.log").read_text().splitlines()[-1])
    assert entry["event"] == "health_baseline_reset" and entry["gpu"] == 0
    after = cli.check("--mode pass --gemm 700")
    baseline = after["baseline"]
    assert after["status"] == "pass" and isinstance(baseline, dict) and baseline["recorded"] is True
    _, text = cli("health", "baseline", "show", "--json")
    (view,) = json.loads(text)["baselines"]
    assert (view["runs"], view["established"], view["rule"]) == (1, False, "reset")


def test_a_figure_beyond_the_h200s_peak_never_joins_though_another_sku_could_reach_it(tmp_path: Path) -> None:
    """On a host whose snapshot names H200s, 1,200 TFLOP/s (above the H200's 989.5 x 1.15, below an MI300X's) is
    refused: the SKU is root's, never the probe's (corroboration fails the run, so it never reaches the baseline)."""
    settings = fake_probe_settings("--gemm", "1200")
    nvml = make_fake_nvml([[0.0], [90.0]])
    result = run_health_check(make_host({"pynvml": nvml}), settings, str(tmp_path / "state"),
                              snapshot=make_snapshot(), probe_path=FAKE_PROBE)
    assert result.status == "failed" and result.baseline is None and result.corroboration is not None
    (disagreement,) = result.corroboration.disagreements
    assert disagreement.kind == "above_peak" and "H200 SXM" in disagreement.message

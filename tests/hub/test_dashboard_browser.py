"""The dashboard in a real browser: Debian's headless Chromium (through chromedriver and Selenium) against a real
``gpuguard hub serve`` on 127.0.0.1 over a seeded fleet; assertions on what the pages show.

Each hub's clock stands still at the time its fixture seeded its fleet against (``HubProcess(now=...)``), so what
the pages call stale or recent is the same however long the suite takes to reach a test.

Screenshots of each page go to the test's tmp dir; with ``UPDATE_SCREENSHOTS=1`` they also replace
docs/dashboard/*.png (the ones docs/hub.md shows).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path
from typing import Any, Iterator, List

import pytest

from agent.hub.tokens import add_token
from tests import needs
from tests.hub.fleet_seed import EXPECTED, HOSTILE_HOSTNAME, HOSTILE_VERSION, NOW, REGRESSED_HEALTH, seed
from tests.hub.process import HubProcess, write_config

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DOCS = Path(__file__).resolve().parents[2] / "docs" / "dashboard"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    tmp = tmp_path_factory.mktemp("dashboard")
    url = f"sqlite:///{tmp}/hub.db"
    seed(url, NOW)
    yield from serving(tmp, url, NOW)


def serving(tmp: Path, url: str, now: dt.datetime) -> Iterator[HubProcess]:
    """A hub process over the database at ``url`` whose clock reads ``now``, with a reader token in
    ``reader_token``, until the test ends. It trusts the key the seeded bundles were signed with: a hub offers and
    counts only the stored bundles that verify against its policy_keys_dir."""
    from tests.hub.signing import keys_dir

    tokens = tmp / "tokens.json"
    hub = HubProcess(write_config(tmp / "hub.toml", listen_port=0, database_url=url, tokens_file=tokens,
                                  tokens_reload_seconds=0, policy_keys_dir=keys_dir()), now=now)
    hub.reader_token = add_token(str(tokens), "reader", "ops")
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        needs.unavailable("dashboard browser tests", f"{', '.join(missing)} missing: apt-get install chromium "
                                                     "chromium-driver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        needs.unavailable("dashboard browser tests", f"selenium is not installed ({exc}): pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000",
                "--disable-dev-shm-usage", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def shot(driver: Any, tmp_path: Path, name: str) -> None:
    """Screenshot of the whole page, kept with the test; copied into docs/ when asked to."""
    from selenium.webdriver.common.by import By

    height = driver.find_element(By.TAG_NAME, "body").size["height"]
    driver.set_window_size(1280, max(600, min(height + 40, 2400)))
    path = tmp_path / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 1000)
    assert path.stat().st_size > 5000
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        DOCS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS / f"{name}.png")


def click_and_load(driver: Any, element: Any) -> None:
    """Click something that loads a page, and wait until the new page has replaced the old one (reading at once
    would find the old page's elements, gone a moment later)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    old_page = driver.find_element("tag name", "html")

    def replaced(_driver: Any) -> bool:
        try:
            old_page.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            # Asked in the very moment the new document replaces the old one, Chromium 156 answers "Node with given
            # id does not belong to the document" (an unknown error, not a stale element): replaced as well.
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    element.click()
    WebDriverWait(driver, 15).until(replaced)


def host_ids(driver: Any) -> List[str]:
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "table#hosts tr.host")
    return [r.get_attribute("data-host-id") for r in rows]


def test_the_dashboard_in_chromium(hub: HubProcess, browser: Any, tmp_path: Path) -> None:
    """Login required; counts, the violating host, search, the host page's timeline and plot, pairings."""
    from selenium.webdriver.common.by import By

    d = browser
    d.get(f"{hub.url}/ui/")
    assert "/ui/login" in d.current_url and not host_ids(d)
    assert "gpu-ok-01" not in d.page_source
    shot(d, tmp_path, "login")

    d.find_element(By.ID, "token").send_keys("gg1.0123456789abcdef.wrong")
    click_and_load(d, d.find_element(By.ID, "login"))
    assert d.find_element(By.ID, "login-error").text == "invalid reader token"
    d.find_element(By.ID, "token").send_keys(hub.reader_token)
    click_and_load(d, d.find_element(By.ID, "login"))

    assert d.current_url == f"{hub.url}/ui/"
    counts = {k: int(d.find_element(By.ID, f"count-{k.replace('host_count', 'hosts')}").text)
              for k in EXPECTED}
    assert counts == EXPECTED
    assert len(host_ids(d)) == EXPECTED["host_count"]
    bad = d.find_element(By.CSS_SELECTOR, 'tr.host[data-host-id="gpu-bad-01"] .compliance')
    assert bad.text == "violating"
    odd = d.find_element(By.CSS_SELECTOR, 'tr.host[data-host-id="gpu-odd-01"]')
    assert HOSTILE_HOSTNAME in odd.text and not odd.find_elements(By.TAG_NAME, "b")
    shot(d, tmp_path, "overview")

    search = d.find_element(By.ID, "f-q")
    search.send_keys("regressed")
    click_and_load(d, d.find_element(By.ID, "apply"))
    assert host_ids(d) == ["gpu-regressed-01"]
    assert d.find_element(By.ID, "match-summary").text.startswith("1 matching host")

    click_and_load(d, d.find_element(By.LINK_TEXT, "gpu-regressed-01"))
    timeline = d.find_elements(By.CSS_SELECTOR, "#drift li.drift-entry")
    assert [li.get_attribute("data-kind") for li in timeline] == ["cpu_fallback", "health_regression",
                                                                 "snapshot_changed"]
    assert "535.183.01 \u2192 550.90.07" in timeline[2].text
    assert len(d.find_elements(By.CSS_SELECTOR, "svg#health-plot circle.point")) == len(REGRESSED_HEALTH)
    shot(d, tmp_path, "host")

    click_and_load(d, d.find_element(By.LINK_TEXT, "Pairings"))
    rows = d.find_elements(By.CSS_SELECTOR, "table#pairings tr.pairing")
    assert len(rows) == 4 and any(HOSTILE_VERSION in r.text for r in rows)
    assert not d.find_elements(By.CSS_SELECTOR, "table#pairings img")
    shot(d, tmp_path, "pairings")

    click_and_load(d, d.find_element(By.CSS_SELECTOR, "header form button"))
    d.get(f"{hub.url}/ui/pairings")
    assert "/ui/login" in d.current_url


@pytest.fixture(scope="module")
def policy_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """A hub with bundles 41 (all hosts) and 42 (rack a7 only) and three hosts: one current, one behind, one that
    refused 42 with a reason an attacker could have written."""
    from agent.hub.bundles import PolicyBundles
    from agent.hub.store import make_store
    from agent.hub.tokens import Principal
    from agent.report.events import Heartbeat
    from tests.hub.factories import ROCM_62, event
    from tests.hub.signing import check, signature_of
    from tests.hub.test_policy_bundles import bundle_bytes

    tmp = tmp_path_factory.mktemp("policy-dashboard")
    url = f"sqlite:///{tmp}/hub.db"
    store = make_store(url)
    store.open()
    now = NOW
    bundles = PolicyBundles(store, check(), clock=lambda: now)
    admin = Principal(role="admin", subject="alice")
    bundles.push(admin, bundle_bytes(41), signature_of(bundle_bytes(41)))
    bundles.push(admin, bundle_bytes(42, labels={"rack": "a7"}), signature_of(bundle_bytes(42, labels={"rack": "a7"})))
    beats = [("node-current", {"policy_serial": 42}), ("node-behind", {"policy_serial": 41}),
             ("node-refused", {"policy_serial": 41, "policy_refused_serial": 42,
                               "policy_refused_reason": HOSTILE_VERSION})]
    store.ingest([[event(host, at=now).model_copy(update={"payload": Heartbeat(
        agent_version="1.0", uptime_seconds=1.0, pairing=ROCM_62, labels={"rack": "a7"}, policy_source="bundle",
        **fields)}) for host, fields in beats]], received_at=now)
    store.close()
    yield from serving(tmp, url, now)


def test_the_policy_pages_in_chromium(policy_hub: HubProcess, browser: Any, tmp_path: Path) -> None:
    """The overview's policy section names the host that refused (its reason shown as text) and the host behind;
    the host page shows its serials; /ui/policy lists both bundles and the audit trail."""
    from selenium.webdriver.common.by import By

    d = browser
    d.get(f"{policy_hub.url}/ui/login")
    d.find_element(By.ID, "token").send_keys(policy_hub.reader_token)
    click_and_load(d, d.find_element(By.ID, "login"))
    assert d.find_element(By.ID, "policy-newest").text == "42"
    assert (d.find_element(By.ID, "policy-behind-count").text, d.find_element(By.ID, "policy-refused-count").text) \
        == ("2", "1")
    refused = d.find_element(By.CSS_SELECTOR, 'table#policy-refused tr.refused[data-host-id="node-refused"]')
    assert HOSTILE_VERSION in refused.text and not refused.find_elements(By.TAG_NAME, "img")
    behind = [r.get_attribute("data-host-id") for r in d.find_elements(By.CSS_SELECTOR, "table#policy-behind tr")
              if r.get_attribute("data-host-id")]
    assert behind == ["node-behind", "node-refused"]
    shot(d, tmp_path, "policy-overview")

    click_and_load(d, d.find_element(By.CSS_SELECTOR, 'table#policy-behind a[href="/ui/hosts/node-behind"]'))
    assert d.find_element(By.ID, "policy-behind").text == "behind"
    assert "42" in d.find_element(By.XPATH, "//th[text()='Offered serial']/following-sibling::td").text

    click_and_load(d, d.find_element(By.LINK_TEXT, "Policy"))
    serials = [r.get_attribute("data-serial") for r in d.find_elements(By.CSS_SELECTOR, "table#bundles tr.bundle")]
    assert serials == ["42", "41"]
    assert len(d.find_elements(By.CSS_SELECTOR, "table#audit tr.audit")) == 2
    shot(d, tmp_path, "policy")


@pytest.fixture(scope="module")
def rollout_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """A hub whose rollout of bundle 2 halted: the canary of the AMD cohort reported cpu_fallback on serial 2."""
    from agent.hub.bundles import PolicyBundles
    from agent.hub.rollout_plan import RolloutSpec
    from agent.hub.rollouts import Rollouts
    from agent.hub.store import make_store
    from agent.hub.tokens import Principal
    from agent.report.events import Heartbeat
    from tests.hub.factories import CUDA_12, ROCM_62, event
    from tests.hub.signing import check, signature_of
    from tests.hub.test_policy_bundles import bundle_bytes

    tmp = tmp_path_factory.mktemp("rollout-dashboard")
    url = f"sqlite:///{tmp}/hub.db"
    store = make_store(url)
    store.open()
    admin = Principal(role="admin", subject="alice")
    now = [NOW]  # the fixture's clock: a second on for each step, as the steps once took (the soak is 60 s)

    def beats(hosts: List[str], serial: int, health: str) -> None:
        now[0] += dt.timedelta(seconds=1)
        store.ingest([[event(h, at=now[0]).model_copy(update={"payload": Heartbeat(
            agent_version="1.0", uptime_seconds=1.0, pairing=ROCM_62 if h.startswith("amd") else CUDA_12,
            policy_source="bundle", policy_serial=serial, last_health_status=health)}) for h in hosts]],
            received_at=now[0])

    beats(["amd-1", "amd-2", "amd-3", "nv-1", "nv-2"], 1, "pass")
    bundles = PolicyBundles(store, check(), clock=lambda: now[0])
    bundles.push(admin, bundle_bytes(1), signature_of(bundle_bytes(1)))
    bundles.push(admin, bundle_bytes(2), signature_of(bundle_bytes(2)))
    rollouts = Rollouts(store, bundles, clock=lambda: now[0])
    now[0] += dt.timedelta(seconds=1)
    rid = rollouts.start(admin, RolloutSpec(target_serial=2, batches=(50, 100), soak_seconds=60)).rollout.rollout_id
    beats(["amd-1"], 2, "cpu_fallback")
    now[0] += dt.timedelta(seconds=1)
    rollouts.evaluate(rid)
    store.close()
    yield from serving(tmp, url, now[0])


def test_the_rollout_pages_in_chromium(rollout_hub: HubProcess, browser: Any, tmp_path: Path) -> None:
    """/ui/rollouts shows the halted rollout; its page says why, naming the failing canary and its result, and
    marks that host's row as failed."""
    from selenium.webdriver.common.by import By

    d = browser
    d.get(f"{rollout_hub.url}/ui/login")
    d.find_element(By.ID, "token").send_keys(rollout_hub.reader_token)
    click_and_load(d, d.find_element(By.ID, "login"))
    click_and_load(d, d.find_element(By.LINK_TEXT, "Rollouts"))
    [row] = d.find_elements(By.CSS_SELECTOR, "table#rollouts tr.rollout")
    assert "halted" in row.text and "amd-1" in row.text
    shot(d, tmp_path, "rollouts")
    click_and_load(d, row.find_element(By.TAG_NAME, "a"))
    assert d.find_element(By.ID, "rollout-state").text == "halted"
    assert d.find_element(By.ID, "rollout-reason").text == \
        "1 of 2 canaries failed: amd-1 (health cpu_fallback on serial 2)"
    failed = d.find_elements(By.CSS_SELECTOR, "table#rollout-hosts tr.rollout-host.fail")
    assert [r.get_attribute("data-host-id") for r in failed] == ["amd-1"]
    shot(d, tmp_path, "rollout")

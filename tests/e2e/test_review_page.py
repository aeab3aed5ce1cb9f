"""The review page in a real browser: Debian's ``chromium`` driven by Selenium through Debian's
``chromium-driver``, against ``observer api`` started as its own process on a SQLite store.

The test signs in with a token, filters the list, opens an exchange (its messages, answer and
tool call visible), follows its conversation, opens an incident from it (the exchange is then
under a legal hold), and sees the incident with its Art. 73 deadline; then signs in as a viewer
and checks that the prompt and the answer are not in the page at all. Screenshots of each step
are saved to ``build/screenshots/review-page/`` (override: ``OBSERVER_SCREENSHOTS``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from observer.records import Block, Exchange, RequestFacts, ToolCall, Usage
from observer.store.migrate import upgrade
from observer.store.store import AuditStore
from tests.e2e.harness import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
TOKEN = "review-page-bootstrap-token-0123456789"
PROMPT = "Which invoices from ACME are overdue?"
ANSWER = "Three ACME invoices are overdue: 1042, 1057 and 1063."
FOLLOW_UP = "Draft a reminder for invoice 1042."
ANSWER_2 = "Dear ACME, invoice 1042 is now 30 days overdue."
T0 = datetime(2026, 11, 30, 9, 15, tzinfo=timezone.utc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _records() -> list[Exchange]:
    """A two-turn chat (the second resends the first and its answer), and an unrelated one."""
    first_messages = [{"role": "user", "content": PROMPT}]
    first = Exchange(
        id="a0000000-0000-4000-8000-000000000001",
        started_at=T0,
        dialect="openai.chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/2.0",
        status_code=200,
        outcome="completed",
        model="gpt-4o-2024-08-06",
        stop_reason="tool_use",
        request=RequestFacts(model="gpt-4o", stream=True, messages=first_messages, end_user="alice"),
        blocks=[Block(index=0, type="text", text=ANSWER, stop_reason="end_turn")],
        tool_calls=[ToolCall(index=0, id="call_1", name="lookup_invoice", arguments='{"number": 1042}', declared=True)],
        usage=Usage(input_tokens=21, output_tokens=17, reported=True),
        ttft_s=0.42,
    )
    second = Exchange(
        id="a0000000-0000-4000-8000-000000000002",
        started_at=T0 + timedelta(minutes=2),
        dialect="openai.chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        method="POST",
        http_version="HTTP/2.0",
        status_code=200,
        outcome="completed",
        model="gpt-4o-2024-08-06",
        stop_reason="end_turn",
        request=RequestFacts(
            model="gpt-4o",
            stream=True,
            messages=[
                *first_messages,
                {
                    "role": "assistant",
                    "content": ANSWER,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "lookup_invoice", "arguments": '{"number": 1042}'},
                        }
                    ],
                },
                {"role": "user", "content": FOLLOW_UP},
            ],
            end_user="alice",
        ),
        blocks=[Block(index=0, type="text", text=ANSWER_2, stop_reason="end_turn")],
        usage=Usage(input_tokens=60, output_tokens=12, reported=True),
        ttft_s=0.31,
    )
    other = Exchange(
        id="a0000000-0000-4000-8000-000000000003",
        started_at=T0 + timedelta(minutes=5),
        dialect="anthropic.messages",
        host="api.anthropic.com",
        path="/v1/messages",
        method="POST",
        http_version="HTTP/1.1",
        status_code=200,
        outcome="client_aborted",
        model="claude-sonnet-4-5",
        request=RequestFacts(model="claude-sonnet-4-5", stream=True, messages=[{"role": "user", "content": "Hello"}]),
        blocks=[Block(index=0, type="text", text="Hi the", stop_reason=None)],
    )
    return [first, second, other]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, AuditStore]]:
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.fail("chromium and chromium-driver are needed (Debian packages; .ci/run installs them)")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    store = AuditStore(url)
    store.write_many(_records(), writer_id="b0000000-0000-4000-8000-00000000000b", seqs=[1, 2, 3])
    port = _free_port()
    env = {**os.environ, "OBSERVER_API_TOKEN": TOKEN, "OBSERVER_DATA_DIR": str(tmp_path / "data")}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("observer")), "api", "--db", url, "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("observer api did not start: " + (proc.stdout.read().decode() if proc.stdout else ""))
    try:
        yield base, store
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        store.dispose()


@pytest.fixture
def browser() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM or ""
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1360,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER or ""), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _shots() -> Path:
    folder = Path(os.environ.get("OBSERVER_SCREENSHOTS", REPO / "build" / "screenshots" / "review-page"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _wait(driver: object, condition: object) -> None:
    """Waits (at most 20 s) for ``condition``: a click's navigation may still be under way when
    ``click()`` returns."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 20).until(condition)  # type: ignore[arg-type]


def _click_and_load(driver: object, element: object) -> None:
    """Clicks ``element`` and waits until the page it was on is gone and the new one is loaded.
    A node of the page being replaced may also be reported by chromedriver as "does not belong
    to the document" (an unknown error, not ``StaleElementReferenceException``: seen in CI with
    Chromium 156.0.8078.114); that is the old page gone too."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    def gone(_driver: object) -> bool:
        try:
            element.is_enabled()  # type: ignore[attr-defined]
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    element.click()  # type: ignore[attr-defined]
    _wait(driver, gone)
    _wait(driver, lambda d: d.execute_script("return document.readyState") == "complete")


def _sign_in(driver: object, base: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(base + "/ui/")  # type: ignore[attr-defined]
    assert "/ui/login" in driver.current_url  # type: ignore[attr-defined]
    driver.find_element(By.NAME, "token").send_keys(token)  # type: ignore[attr-defined]
    _click_and_load(driver, driver.find_element(By.CSS_SELECTOR, "form[action='/ui/login'] button"))  # type: ignore[attr-defined]


def test_review_page_in_chromium(api: tuple[str, AuditStore], browser: object, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    base, store = api
    shots = _shots()
    d = browser
    _sign_in(d, base, TOKEN)
    assert d.current_url == base + "/ui/"  # type: ignore[attr-defined]
    rows = d.find_elements(By.CSS_SELECTOR, "tbody tr")  # type: ignore[attr-defined]
    assert len(rows) == 3
    d.save_screenshot(str(shots / "1-list.png"))  # type: ignore[attr-defined]

    # Filter: only alice's OpenAI exchanges.
    d.find_element(By.NAME, "user").send_keys("alice")  # type: ignore[attr-defined]
    d.find_element(By.NAME, "host").send_keys("api.openai.com")  # type: ignore[attr-defined]
    _click_and_load(d, d.find_element(By.CSS_SELECTOR, "form.filters button"))  # type: ignore[attr-defined]
    rows = d.find_elements(By.CSS_SELECTOR, "tbody tr")  # type: ignore[attr-defined]
    assert len(rows) == 2, d.page_source[:2000]  # type: ignore[attr-defined]
    assert "user=alice" in d.current_url  # type: ignore[attr-defined]
    d.save_screenshot(str(shots / "2-filtered.png"))  # type: ignore[attr-defined]

    # Open the first turn (the older row is last: newest first).
    _click_and_load(d, rows[-1].find_element(By.TAG_NAME, "a"))
    page = d.page_source  # type: ignore[attr-defined]
    assert PROMPT in page and ANSWER in page and "lookup_invoice" in page and "1042" in page
    assert "0.420 s" in page and "21 / 17" in page
    d.save_screenshot(str(shots / "3-exchange.png"))  # type: ignore[attr-defined]

    # Its conversation: both turns, oldest first.
    _click_and_load(d, d.find_element(By.PARTIAL_LINK_TEXT, "a0000000"))  # type: ignore[attr-defined]
    assert "/ui/conversations/a0000000-0000-4000-8000-000000000001" in d.current_url  # type: ignore[attr-defined]
    links = [a.get_attribute("href") for a in d.find_elements(By.CSS_SELECTOR, "tbody tr td:first-child a")]  # type: ignore[attr-defined]
    assert [h.rsplit("/", 1)[1] for h in links] == [
        "a0000000-0000-4000-8000-000000000001",
        "a0000000-0000-4000-8000-000000000002",
    ]
    d.save_screenshot(str(shots / "4-conversation.png"))  # type: ignore[attr-defined]

    # Back to the first turn, open an incident from it.
    d.get(base + "/ui/exchanges/a0000000-0000-4000-8000-000000000001")  # type: ignore[attr-defined]
    d.find_element(By.NAME, "title").send_keys("Invoice data shown to the wrong customer")  # type: ignore[attr-defined]
    d.find_element(By.CSS_SELECTOR, "select[name='category'] option[value='fundamental_rights']").click()  # type: ignore[attr-defined]
    d.find_element(By.NAME, "aware_at").send_keys("2026-11-30T10:00:00Z")  # type: ignore[attr-defined]
    d.find_element(By.NAME, "note").send_keys("Reported by the customer by phone.")  # type: ignore[attr-defined]
    _click_and_load(d, d.find_element(By.CSS_SELECTOR, "form[action='/ui/incidents'] button"))  # type: ignore[attr-defined]
    assert "/ui/incidents/" in d.current_url  # type: ignore[attr-defined]
    page = d.page_source  # type: ignore[attr-defined]
    # Art. 73(2): 15 days after awareness.
    assert "2026-12-15T10:00:00.000000Z" in page and "Reported by the customer by phone." in page
    assert "a0000000-0000-4000-8000-000000000001" in page
    d.save_screenshot(str(shots / "5-incident.png"))  # type: ignore[attr-defined]
    _click_and_load(d, d.find_element(By.LINK_TEXT, "Incidents"))  # type: ignore[attr-defined]
    assert "2026-12-15 10:00" in d.page_source  # type: ignore[attr-defined]
    d.save_screenshot(str(shots / "6-incidents.png"))  # type: ignore[attr-defined]

    # The exchange is under a legal hold now (observer.store.holds).
    held = httpx.get(base + "/v1/holds", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).json()
    assert [h["scope"]["exchange_ids"] for h in held] == [["a0000000-0000-4000-8000-000000000001"]]

    # A viewer: the page holds no prompt and no answer at all.
    from observer.store.checkpoint import CheckpointKey
    from observer.store.tokens import create_token

    key = CheckpointKey.load_or_create(tmp_path / "data" / "checkpoint-key.pem")  # the API's own key
    viewer, _row = create_token(
        store.engine, key, store.store_id(), name="viewer-1", role="viewer", actor="test", at=datetime.now(timezone.utc)
    )
    d.delete_all_cookies()  # type: ignore[attr-defined]
    _sign_in(d, base, viewer)
    d.get(base + "/ui/exchanges/a0000000-0000-4000-8000-000000000001")  # type: ignore[attr-defined]
    page = d.page_source  # type: ignore[attr-defined]
    assert "viewer" in page and "sees metadata and usage only" in page
    assert PROMPT not in page and ANSWER not in page and "1042" not in page
    assert "21 / 17" in page
    d.save_screenshot(str(shots / "7-viewer.png"))  # type: ignore[attr-defined]

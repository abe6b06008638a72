"""Every course notebook, run in a real JupyterLab front end in headless Chromium.

nbval executes notebooks through a kernel only; it never renders an output, so a widget that fails to
display (a front-end/kernel version mismatch, a missing lab extension) would pass it. Here each lesson is
opened in JupyterLab (a private server on 127.0.0.1, token auth, a temporary root holding copies of the
notebooks, so the repository is never written), its outputs are cleared, Run > Run All Cells is clicked, and
once the kernel is idle with no cell queued we assert: every code cell ran, no cell shows an error or a
traceback, and in notebooks that call ``interact`` the widgets rendered (no "Error displaying widget", no
"Loading widget..." left). Opt-in, see docs/browser-test.md:

    MINIGPT_BROWSER_TEST=1 python -m pytest tests/browser -v
    MINIGPT_BROWSER_NOTEBOOKS=00,01 ...      # only lessons whose file name starts with these
    MINIGPT_BROWSER_DIR=solutions ...        # another folder of notebooks (default: course/)
    MINIGPT_BROWSER_SCREENSHOTS=DIR ...      # save a screenshot of each notebook (at its first widget)
    MINIGPT_CHROMIUM=/path/to/chromium ...   # default /usr/bin/chromium (Debian's package)
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COURSE = Path(os.environ.get("MINIGPT_BROWSER_DIR", ROOT / "course"))  # e.g. solutions/ instead
CHROMIUM = os.environ.get("MINIGPT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NOTEBOOK_TIMEOUT_S = float(os.environ.get("MINIGPT_BROWSER_TIMEOUT", "900"))  # per notebook, run all cells
UI_TIMEOUT_S = 180  # page load, a menu click, the kernel starting
WIDGET_PROBLEMS = ("Error displaying widget", "Loading widget...", "Failed to load model class",
                   "model not found")


def _selected_notebooks() -> list[Path]:
    nbs = sorted(p for p in COURSE.glob("*.ipynb") if not p.name.startswith("."))
    wanted = [w.strip() for w in os.environ.get("MINIGPT_BROWSER_NOTEBOOKS", "").split(",") if w.strip()]
    return [nb for nb in nbs if not wanted or any(nb.name.startswith(w) for w in wanted)]


def _uses_interact(path: Path) -> bool:
    """Does a code cell call ``interact``/``interactive`` or ``minigpt.plots.explore`` (which wraps interact)?"""
    nb = json.loads(path.read_text())
    return any(c["cell_type"] == "code" and re.search(r"\b(interact|interactive|explore)\s*\(", "".join(c["source"]))
               for c in nb["cells"])


pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def chromium():
    playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: "
                                         "pip install playwright (never `playwright install`; Chromium comes "
                                         "from apt-get install chromium)")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install -y chromium (or set MINIGPT_CHROMIUM)")
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(settings_dir: Path) -> None:
    """User settings for this private JupyterLab: render every cell (no windowing, so the DOM holds all
    outputs) and never reach for the network (no news, no update check)."""
    files = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
             "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
                 {"checkForUpdates": False, "fetchNews": "false"}}
    for rel, value in files.items():
        (settings_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (settings_dir / rel).write_text(json.dumps(value))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on 127.0.0.1 serving copies of the course notebooks: yields (base_url, token)."""
    base = tmp_path_factory.mktemp("jupyterlab")
    root, settings = base / "root", base / "settings"
    root.mkdir()
    for nb in COURSE.glob("*.ipynb"):
        shutil.copy(nb, root / nb.name)
    _write_settings(settings)
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings), "JUPYTERLAB_WORKSPACES_DIR": str(base / "ws"),
           "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
           "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")  # containers and CI images often run as root
    log = open(base / "server.log", "w")
    server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            pytest.fail(f"JupyterLab did not start (exit {server.poll()}); log: {base / 'server.log'}")
        time.sleep(1)
    yield url, token
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _api(url: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(f"{url}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body else None


def _shutdown_sessions(url: str, token: str) -> None:
    for s in _api(url, token, "/api/sessions"):
        _api(url, token, f"/api/sessions/{s['id']}", "DELETE")


# The state of the notebook in the current tab, read from JupyterLab's own models (window.jupyterapp is
# there because the server runs with expose_app_in_browser).
STATE_JS = """() => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  if (!w || !w.content || !w.sessionContext) return null;
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  const code = w.content.widgets.filter(c => c.model.type === 'code');
  const prompts = [...w.node.querySelectorAll('.jp-InputPrompt')].map(p => p.textContent.trim());
  const errors = [];
  let widget_outputs = 0;
  code.forEach((c, i) => c.model.outputs.toJSON().forEach(o => {
    if (o.output_type === 'error') errors.push(`code cell ${i + 1}: ${o.ename}: ${o.evalue}`);
    if (o.data && o.data['application/vnd.jupyter.widget-view+json']) widget_outputs += 1;
  }));
  return {kernel: kernel ? kernel.status : 'none', n_code: code.length,
          executed: code.filter(c => c.model.executionCount !== null).length,
          running: prompts.filter(p => p.includes('*')).length, errors, widget_outputs};
}"""

# Widget outputs drawn in the page: an output area whose top element is a widget view (a widget that failed
# shows an error text there instead), and the interact containers among all views.
WIDGETS_JS = """() => ({
  rendered: document.querySelectorAll('.jp-OutputArea-output > .jupyter-widgets').length,
  views: document.querySelectorAll('.jupyter-widgets').length,
  interact: document.querySelectorAll('.widget-interact').length})"""


def _menu(page, menu: str, item: str) -> None:
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(menu)}$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{re.escape(item)}$")).first.click()


def _wait(page, condition, timeout: float, what: str, poll: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = page.evaluate(STATE_JS)
        if state is not None and condition(state):
            return state
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last state: {page.evaluate(STATE_JS)}")


@pytest.mark.parametrize("notebook", _selected_notebooks(), ids=lambda p: p.stem)
def test_notebook_runs_and_renders_in_jupyterlab(notebook, lab, chromium):
    url, token = lab
    page = chromium.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(UI_TIMEOUT_S * 1000)  # JupyterLab is heavy JavaScript; a busy machine is slow
    console_errors = []
    page.on("pageerror", lambda e: console_errors.append(str(e)))
    t0, passed = time.monotonic(), False
    try:
        page.goto(f"{url}/lab/workspaces/{notebook.stem}/tree/{notebook.name}?reset&token={token}",
                  wait_until="domcontentloaded")
        page.wait_for_selector(".jp-Notebook .jp-Cell")
        _wait(page, lambda s: s["kernel"] == "idle", UI_TIMEOUT_S, "the kernel to start")
        _menu(page, "Edit", "Clear Outputs of All Cells")
        state = _wait(page, lambda s: s["executed"] == 0, UI_TIMEOUT_S, "cleared outputs")
        n_code = state["n_code"]
        _menu(page, "Run", "Run All Cells")
        _wait(page, lambda s: s["running"] > 0 or s["executed"] > 0, UI_TIMEOUT_S, "the run to start")
        settled = {"n": 0}

        def finished(s):  # idle, nothing queued, twice in a row (the kernel is idle between cells too)
            settled["n"] = settled["n"] + 1 if s["kernel"] == "idle" and s["running"] == 0 else 0
            return settled["n"] >= 2 or s["errors"]
        state = _wait(page, finished, NOTEBOOK_TIMEOUT_S, "Run All Cells to finish")
        run_s = time.monotonic() - t0
        assert not state["errors"], f"{notebook.name}: error outputs: {state['errors']}"
        assert state["executed"] == n_code, f"{notebook.name}: only {state['executed']} of {n_code} code cells ran"
        stderr = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
        tracebacks = [t for t in stderr.all_inner_texts() if "Traceback" in t]
        assert not tracebacks, f"{notebook.name}: traceback in a stderr output: {tracebacks[0][:500]}"

        uses_interact = _uses_interact(notebook)
        assert state["widget_outputs"] > 0 or not uses_interact, \
            f"{notebook.name} calls interact/explore but its run displayed no widget"
        n_widgets = n_interact = 0
        if state["widget_outputs"] or uses_interact:
            deadline = time.monotonic() + 60  # widget views render asynchronously after the kernel is idle
            while True:
                drawn = page.evaluate(WIDGETS_JS)
                text = page.locator(".jp-Notebook").inner_text()
                problems = [p for p in WIDGET_PROBLEMS if p in text]
                n_widgets, n_interact = drawn["views"], drawn["interact"]
                done = (drawn["rendered"] == state["widget_outputs"] and not problems
                        and (n_interact or not uses_interact))
                if done or time.monotonic() > deadline:
                    break
                time.sleep(1)
            assert not problems, f"{notebook.name}: widget output shows {problems}"
            assert drawn["rendered"] == state["widget_outputs"], (f"{notebook.name}: {state['widget_outputs']} widget "
                                                                  f"outputs in the notebook, {drawn['rendered']} drawn")
            assert n_interact > 0 or not uses_interact, f"{notebook.name}: no interact container was drawn"
        if n_interact:
            page.locator(".widget-interact").first.scroll_into_view_if_needed()
        passed = True
        print(f"{notebook.name}: {n_code} code cells ran in JupyterLab in {run_s:.0f} s, "
              f"{n_interact} interact widgets ({n_widgets} widget views), page errors: {len(console_errors)}")
    finally:
        shots = os.environ.get("MINIGPT_BROWSER_SCREENSHOTS")
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(shots) / f"{notebook.stem}{'' if passed else '-failed'}.png"))
        page.close()
        _shutdown_sessions(url, token)

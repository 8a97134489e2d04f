"""Debian's headless Chromium for the browser class's test and benchmark, driven by Selenium (the serving venv).

``make setup-browser`` installs ``chromium`` and ``chromium-driver``. The flags keep a headless root
process quiet on a closed network (no background connections, updates or sync) and let the page's
AudioWorklet play without a click. ``software_webgpu`` gives the page WebGPU without a GPU: SwiftShader's
Vulkan driver, which Debian's chromium ships, as Chromium's own fuzzers run it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WINDOW = (1000, 700)  # the screenshot in docs/serving/browser.md
SOFTWARE_WEBGPU_FLAGS = (
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
    "--disable-vulkan-surface",
    "--ignore-gpu-blocklist",
)


def open_headless_chromium(
    profile: Path,
    *,
    log_path: Path | None = None,
    console_log: bool = False,
    network_log: bool = False,
    software_webgpu: bool = False,
) -> Any:
    """A Selenium driver of headless Chromium with a fresh profile in ``profile``; ``log_path``: chromedriver's log;
    ``console_log``: the page's console as ``driver.get_log("browser")``; ``network_log``: DevTools' Network events
    (requests with their URL and headers, responses with theirs) as ``driver.get_log("performance")``;
    ``software_webgpu``: ``navigator.gpu`` gives SwiftShader's adapter (architecture ``swiftshader``), else no GPU."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: run `make setup-browser` (Debian's chromium, chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        *(SOFTWARE_WEBGPU_FLAGS if software_webgpu else ("--disable-gpu",)),
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--autoplay-policy=no-user-gesture-required",  # the AudioWorklet plays without a click
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    logs = {"browser": "ALL"} if console_log else {}
    if network_log:
        logs["performance"] = "ALL"  # chromedriver logs the Network domain by default
    if logs:
        options.set_capability("goog:loggingPrefs", logs)
    service = Service(str(CHROMEDRIVER), log_output=str(log_path)) if log_path else Service(str(CHROMEDRIVER))
    return webdriver.Chrome(service=service, options=options)


# Time for chromedriver to answer once the page's own limit has passed (it reports the script timeout then).
DRIVER_SLACK_S = 60


def run_in_page(driver: Any, body: str, *args: Any, timeout: float, wait_for_hook: bool = False) -> Any:
    """Run ``body`` (an async function's body; ``args`` as ``args``) in the page: what it returns, or
    ``{"thrown": message}`` when it rejects. ``timeout`` bounds the page (Selenium's ``TimeoutException`` past it);
    the HTTP read of the answer from chromedriver waits ``DRIVER_SLACK_S`` longer, not the client's default
    120 s, which a slow host's long utterance outlasts. ``wait_for_hook``: wait first for ``window.edgeTest`` (the
    module script may still be loading when the document is complete)."""
    hook = "while (!window.edgeTest) { await new Promise((r) => setTimeout(r, 50)); }\n" if wait_for_hook else ""
    script = (
        "const done = arguments[arguments.length - 1];\n"
        "const args = Array.from(arguments).slice(0, -1);\n"
        f"(async () => {{\n{hook}{body}\n}})().then(done, (e) => done({{thrown: String((e && e.stack) || e)}}));"
    )
    driver.set_script_timeout(timeout)
    driver.command_executor.client_config.timeout = timeout + DRIVER_SLACK_S
    return driver.execute_async_script(script, *args)

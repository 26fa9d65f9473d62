#!/usr/bin/env python3
"""Drives a page in headless Chromium through the DevTools protocol over a pipe.

    drive_page.py CHROMIUM URL SCREENSHOT STEPS.json

STEPS.json is a list of {"name": ..., "js": ...}: each js is the body of an async
function run in the page (it may use `waitFor(condition, what, ms)`, and returns a value
or throws); or {"name": ..., "run": [argv]}: a command run here (it must succeed). Prints one JSON line per step ({"step", "ok", "value" | "error"}); on the first
failure saves a screenshot to SCREENSHOT and exits 1. Chromium is always ended.
Standard library only: --remote-debugging-pipe speaks NUL-separated JSON on fds 3 and 4.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HELPERS = """
const waitFor = async (condition, what, ms = 15000) => {
  const end = Date.now() + ms;
  for (;;) {
    const value = await condition();
    if (value) return value;
    if (Date.now() > end) throw new Error("timed out waiting for " + what);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
};
"""


class Browser:
    def __init__(self, chromium):
        self.profile = tempfile.mkdtemp(prefix="sb-chromium-")
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def map_fds():
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.process = subprocess.Popen(
            [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-pipe", "--user-data-dir=" + self.profile, "--window-size=1280,1600",
             "about:blank"],
            preexec_fn=map_fds, pass_fds=(3, 4), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buffer = b""
        self.next_id = 0
        self.session = None

    def send(self, method, params=None, session=True, timeout=30):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self.read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"].get("message")))
                return reply.get("result", {})

    def read(self, deadline):
        while b"\0" not in self.buffer:
            if time.time() > deadline:
                raise RuntimeError("no answer from Chromium")
            chunk = os.read(self.from_child, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium ended")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url):
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True}, session=False)["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")
        self.send("Page.navigate", {"url": url})
        self.evaluate("await waitFor(() => document.readyState === 'complete', 'the page to load');")

    def evaluate(self, body, timeout=60):
        expression = "(async () => {" + HELPERS + body + "\n})()"
        result = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise RuntimeError(details.get("exception", {}).get("description") or details.get("text"))
        return result.get("result", {}).get("value")

    def screenshot(self, path):
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        with open(path, "wb") as file:
            file.write(base64.b64decode(data))

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except Exception:
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)


def main():
    chromium, url, screenshot, steps_file = sys.argv[1:5]
    with open(steps_file) as file:
        steps = json.load(file)
    browser = Browser(chromium)
    status = 0
    try:
        browser.open(url)
        for step in steps:
            try:
                if "run" in step:
                    value = subprocess.run(step["run"], check=True, capture_output=True, text=True, timeout=60).stdout
                else:
                    value = browser.evaluate(step["js"])
                print(json.dumps({"step": step["name"], "ok": True, "value": value}), flush=True)
            except Exception as error:
                print(json.dumps({"step": step["name"], "ok": False, "error": str(error)}), flush=True)
                try:
                    browser.screenshot(screenshot)
                    print(json.dumps({"screenshot": screenshot}), flush=True)
                except Exception as shot_error:
                    print(json.dumps({"screenshot_error": str(shot_error)}), flush=True)
                status = 1
                break
        else:
            if len(sys.argv) > 5:
                browser.screenshot(sys.argv[5])
    except Exception as error:
        print(json.dumps({"step": "open", "ok": False, "error": str(error)}), flush=True)
        status = 1
    finally:
        browser.close()
    sys.exit(status)


if __name__ == "__main__":
    main()

"""The chat page (service/gateway/www/) in headless Chromium, driven the way a
person uses it: load /, (type the API key,) attach an image, send a prompt,
wait for the streamed answer to finish, check that time to first token and
tokens per second are shown; a second turn on the same conversation; the
stop button; an image the service refuses, shown as an error. A screenshot of
the finished answer is saved and its path printed.

    chat_page.py --base-url http://127.0.0.1:PORT --image FILE --out DIR [--api-key KEY]
                 [--ops-url http://127.0.0.1:OPS_PORT]

Uses Debian's chromium and chromium-driver (ops/install-deps.sh) and selenium
from the tests' venv (tests/gateway/venv.sh). Exit 1 on any failed check.
"""
import argparse
import os
import re
import sys
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from checks import check, summary

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ANSWER_TIMEOUT_S = 120   # one answer on the CPU micro model, on a loaded CI machine
LOAD_TIMEOUT_S = 20      # the page and its model list
MAX_TOKENS = 16
LONG_MAX_TOKENS = 2000   # an answer long enough to be stopped midway
WINDOW = (1100, 900)
CANCELS = "mllama_gateway_cancels_total"


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              f"--window-size={WINDOW[0]},{WINDOW[1]}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def by_id(d, i):
    return d.find_element(By.ID, i)


def last_answer(d):
    answers = d.find_elements(By.CSS_SELECTOR, "#messages li.assistant")
    return answers[-1] if answers else None


def wait_answer(d, states=("done", "error", "stopped")):
    """Waits until the last answer is in one of states; returns it (or None)."""
    try:
        WebDriverWait(d, ANSWER_TIMEOUT_S).until(
            lambda d: last_answer(d) is not None
            and last_answer(d).get_attribute("data-state") in states)
    except TimeoutException:
        a = last_answer(d)
        check(False, f"no answer in {states} after {ANSWER_TIMEOUT_S} s: "
                     f"{a.get_attribute('data-state') if a else 'none'}")
        return None
    return last_answer(d)


def send(d, prompt, image=None, max_tokens=MAX_TOKENS):
    mt = by_id(d, "max-tokens")
    mt.clear()
    mt.send_keys(str(max_tokens))
    if image:
        by_id(d, "image").send_keys(os.path.abspath(image))
        WebDriverWait(d, LOAD_TIMEOUT_S).until(
            lambda d: by_id(d, "image-preview").is_displayed())
    by_id(d, "prompt").send_keys(prompt)
    by_id(d, "send").click()


def test_answer(d, image, out):
    send(d, "Describe this image in one sentence.", image)
    a = wait_answer(d)
    if not a:
        return
    text = a.find_element(By.CSS_SELECTOR, ".text").text
    check(a.get_attribute("data-state") == "done",
          f"the answer finished: {a.get_attribute('data-state')}, error "
          f"{by_id(d, 'error').text!r}")
    check(text.strip() != "", "the answer has text")
    ttft, tps = by_id(d, "ttft").text, by_id(d, "tps").text
    check(re.fullmatch(r"\d+ ms", ttft), f"time to first token shown: {ttft!r}")
    check(re.fullmatch(r"\d+\.\d", tps), f"tokens per second shown: {tps!r}")
    rid = by_id(d, "request-id").text
    check(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", rid), f"request id shown: {rid!r}")
    check(not by_id(d, "error").is_displayed(), "no error shown")
    check(len(d.find_elements(By.CSS_SELECTOR, "#messages li.user img")) == 1,
          "the image is shown with the question")
    shot = os.path.join(out, "chat_page.png")
    d.save_screenshot(shot)
    print(f"chat_page: screenshot {shot}")
    print(f"chat_page: answer {text!r}, ttft {ttft}, {tps} tok/s, {rid}")


def test_second_turn(d):
    send(d, "And in one word?")
    a = wait_answer(d)
    if a:
        check(a.get_attribute("data-state") == "done",
              f"the second turn finished: {by_id(d, 'error').text!r}")
        check(len(d.find_elements(By.CSS_SELECTOR, "#messages li.assistant")) == 2,
              "two answers in the conversation")


def metric(ops_url, name):
    """The sum of a metric's series on the gateway's /metrics."""
    with urllib.request.urlopen(ops_url + "/metrics", timeout=LOAD_TIMEOUT_S) as r:
        lines = r.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines
               if line.startswith(name) and line[len(name)] in " {")


def test_stop(d, ops_url):
    cancels = metric(ops_url, CANCELS) if ops_url else 0
    by_id(d, "new-chat").click()
    send(d, "Write a long story about the sea.", max_tokens=LONG_MAX_TOKENS)
    WebDriverWait(d, ANSWER_TIMEOUT_S).until(
        lambda d: by_id(d, "status").get_attribute("data-state") in ("streaming", "done",
                                                                      "error"))
    by_id(d, "stop").click()
    a = wait_answer(d)
    if a:
        # A micro model may end its answer before the click lands: "done" then.
        check(a.get_attribute("data-state") in ("stopped", "done"),
              f"stopped: {a.get_attribute('data-state')} {by_id(d, 'error').text!r}")
        check(not by_id(d, "stop").is_enabled() and by_id(d, "send").is_enabled(),
              "after stop: send enabled, stop disabled")
        if ops_url and a.get_attribute("data-state") == "stopped":
            check(metric(ops_url, CANCELS) > cancels, f"stop cancelled the request ({CANCELS})")
        print(f"chat_page: stop: {a.get_attribute('data-state')}")


def test_refused_image(d, out):
    by_id(d, "new-chat").click()
    bad = os.path.join(out, "not-an-image.jpg")
    with open(bad, "wb") as f:
        f.write(b"this is not a JPEG")
    send(d, "What is this?", bad)
    a = wait_answer(d)
    if a:
        err = by_id(d, "error")
        check(a.get_attribute("data-state") == "error", "a refused image ends in error")
        check(err.is_displayed() and "invalid_image" in err.text,
              f"the error is shown: {err.text!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True, help="http://host:port")
    ap.add_argument("--image", required=True)
    ap.add_argument("--out", required=True, help="folder for the screenshot")
    ap.add_argument("--api-key", default="")
    ap.add_argument("--ops-url", default="", help="http://host:ops_port: check cancels")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    d = browser()
    try:
        d.get(args.base_url.rstrip("/") + "/")
        check(d.title == "mllama chat", f"title {d.title!r}")
        if args.api_key:
            key = by_id(d, "api-key")
            key.send_keys(args.api_key)
            by_id(d, "prompt").click()   # the change event stores it and reloads models
        try:
            WebDriverWait(d, LOAD_TIMEOUT_S).until(
                lambda d: int(by_id(d, "model").get_attribute("data-loaded") or 0) > 0)
        except TimeoutException:
            check(False, f"the model list loaded: {by_id(d, 'error').text!r}")
        test_answer(d, args.image, args.out)
        test_second_turn(d)
        test_stop(d, args.ops_url.rstrip("/"))
        test_refused_image(d, args.out)
        if args.api_key:
            d.refresh()
            check(by_id(d, "api-key").get_attribute("value") == args.api_key,
                  "the API key is kept across a reload")
        # Script errors only: refused requests (a 401 before the key, the
        # refused image) are logged by the browser as network errors.
        severe = [e for e in d.get_log("browser")
                  if e["level"] == "SEVERE" and e.get("source") != "network"]
        check(not severe, f"no script errors: {severe}")
    finally:
        d.quit()
    return summary()


if __name__ == "__main__":
    sys.exit(main())

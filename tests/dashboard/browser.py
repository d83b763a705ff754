"""The dashboard in a real browser (Debian's chromium, driven by Playwright), against a real
`serve --http` on loopback. Argument: a JSON config with the login link, the server's URL and
where to put screenshots (or null)."""
import json
import os
import sys
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

CONFIG = json.load(open(sys.argv[1]))
BASE = CONFIG["url"]
SHOTS = CONFIG.get("screenshots")


def shot(page, name):
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def refused(token):
    req = urllib.request.Request(BASE + "/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    try:
        urllib.request.urlopen(req, timeout=10)
        return False
    except urllib.error.HTTPError as e:
        return e.code == 401


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CONFIG["chromium"], args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    # Nothing may be asked of any other address.
    outside = []
    page.on("request", lambda r: None if r.url.startswith(BASE) else outside.append(r.url))

    # The printed login link signs the browser in.
    page.goto(CONFIG["login"])
    assert page.url == BASE + "/", page.url
    assert page.get_by_role("heading", name="Overview").is_visible()
    shot(page, "overview")

    # Search the library and open the hostile skill.
    page.get_by_role("link", name="Library").click()
    page.get_by_role("searchbox", name="Search").fill("hostile")
    page.get_by_role("button", name="Search").click()
    shot(page, "library")
    response_holder = {}
    page.on("response", lambda r: response_holder.setdefault(r.url.split("?")[0], r))
    page.get_by_role("link", name="hostile").click()
    page.wait_for_load_state()
    assert page.get_by_role("heading", name="hostile", exact=True).is_visible()
    csp = response_holder[page.url].headers.get("content-security-policy", "")
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp, csp
    # Nothing of the SKILL.md's script, handlers or javascript: links survived or ran.
    assert page.evaluate("window.__pwned === undefined"), page.evaluate("window.__pwned")
    assert page.locator("main script").count() == 0
    assert page.locator("[onerror], [onclick]").count() == 0
    assert page.locator("a[href^='javascript']").count() == 0
    assert page.locator("main iframe").count() == 0
    assert "Safe heading" in page.locator(".rendered").inner_text()
    # Clicking what was a javascript: link runs nothing.
    page.get_by_text("click me").click()
    assert page.evaluate("window.__pwned === undefined")
    shot(page, "skill")

    # Make a client token, see its secret once, revoke it: its next call is refused.
    page.get_by_role("link", name="Tokens").click()
    page.get_by_label("Name").fill("browser-made")
    page.get_by_label("Role").select_option("client")
    page.get_by_role("button", name="Make token").click()
    secret = page.locator(".secret code").inner_text().strip()
    assert secret.startswith("cht_"), secret
    assert not refused(secret)
    shot(page, "tokens")
    page.get_by_role("button", name="Revoke browser-made").click()
    assert page.get_by_role("status").inner_text().startswith("Token browser-made revoked")
    assert refused(secret)

    # The audit log shows both, filtered by action.
    page.get_by_role("link", name="Audit").click()
    page.get_by_label("Action").fill("token.revoke")
    page.get_by_role("button", name="Filter").click()
    assert page.locator("tbody tr").count() == 1
    assert "token:browser-made" in page.locator("tbody").inner_text()
    shot(page, "audit")

    # A narrow window still reads.
    page.set_viewport_size({"width": 420, "height": 800})
    page.goto(BASE + "/library")
    assert page.get_by_role("searchbox", name="Search").is_visible()

    assert outside == [], outside
    browser.close()
print("dashboard: ok")

"""The dashboard in a real browser (Debian's chromium, driven by Playwright), against a real
`serve --http` on loopback. Argument: a JSON config with the login link, the server's URL and
where to put screenshots (or null)."""
import asyncio
import concurrent.futures
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

from mcp import Client
from playwright.sync_api import expect, sync_playwright

CONFIG = json.load(open(sys.argv[1]))
BASE = CONFIG["url"]
SHOTS = CONFIG.get("screenshots")
KIT, FIRST, SECOND = CONFIG["kit"], CONFIG["first"], CONFIG["second"]


def mcp(name, args):
    """One MCP tool call as an agent platform makes it: the official SDK over Streamable
    HTTP with the client token (in a thread: Playwright's sync API owns this one's loop)."""
    async def call():
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client
        http = create_mcp_http_client(headers={"Authorization": "Bearer " + CONFIG["agent"]})
        async with Client(streamable_http_client(BASE + "/mcp", http_client=http), read_timeout_seconds=120) as c:
            r = await c.call_tool(name, args)
            return r.is_error, r.structured_content
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, call()).result()


def mcp_ok(name, args):
    err, out = mcp(name, args)
    assert not err, f"{name} {args}: {out}"
    return out


def shot(page, name):
    audit(page, name)
    if SHOTS:
        os.makedirs(SHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SHOTS, f"{name}.png"), full_page=True)


def nav(page, name):
    page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).click()


def api(path):
    """An API read with the operator's session, as the page's own script would make it (in
    the page: Playwright's own request API sends a Secure cookie to https and localhost only,
    where chromium sends it to every loopback address)."""
    return json.loads(PAGE.evaluate("p => fetch(p).then(r => r.text())", path))


def refused(token):
    req = urllib.request.Request(BASE + "/api/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    try:
        urllib.request.urlopen(req, timeout=10)
        return False
    except urllib.error.HTTPError as e:
        return e.code == 401


# axe-core (tests/dashboard/axe/fetch, run by .ci/setup, puts it here; DASHBOARD_AXE overrides).
AXE = os.environ.get("DASHBOARD_AXE") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "axe", "axe.min.js")
if not os.path.exists(AXE):
    assert not os.environ.get("CI"), f"no axe-core at {AXE}: run tests/dashboard/axe/fetch (.ci/setup does)"
    print(f"axe: skipped, no axe-core at {AXE} (tests/dashboard/axe/fetch brings it)")
    AXE = None
IMPACTS = ["critical", "serious", "moderate", "minor"]
# What axe found, one entry per page (or state of a page) it looked at: (where, violations).
AUDITS = []

# Whether the focused element shows it: an outline (not none, wider than 0, not transparent) or
# a box shadow. None when nothing on the page has the focus; `again` once the walk is back at its
# first stop.
FOCUS_SHOWN = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const again = window.__firstStop === e;
  window.__firstStop = window.__firstStop || e;
  const s = getComputedStyle(e);
  const outline = s.outlineStyle !== "none" && parseFloat(s.outlineWidth) > 0
    && !/^rgba\\(.*, 0\\)$|^transparent$/.test(s.outlineColor);
  const what = e.tagName.toLowerCase() + (e.getAttribute("aria-label") ? `[${e.getAttribute("aria-label")}]`
    : ` "${(e.innerText || e.name || "").trim().slice(0, 40)}"`);
  return { what, again, shown: outline || s.boxShadow !== "none" };
}"""

# The form controls without an accessible name: none from aria-labelledby, aria-label or the
# text of their <label>s (the label's own controls, a select's options, left out).
UNLABELLED = """() => [...document.querySelectorAll("input, select, textarea")]
  .filter(e => e.type !== "hidden")
  .filter(e => {
    const by = (e.getAttribute("aria-labelledby") || "").split(/\\s+/).filter(Boolean)
      .map(id => (document.getElementById(id) || {}).textContent || "").join(" ");
    const labels = [...(e.labels || [])].map(l => {
      const c = l.cloneNode(true);
      c.querySelectorAll("input, select, textarea").forEach(x => x.remove());
      return c.textContent;
    }).join(" ");
    return !(by + (e.getAttribute("aria-label") || "") + labels).trim();
  })
  .map(e => e.outerHTML.slice(0, 120))"""


def audit(page, where):
    """axe's rules on the page as it is now (axe is on every page: an init script, which the
    pages' CSP does not govern, as it would an injected <script>); and every form control has a
    label."""
    if AXE:
        found = page.evaluate("async () => (await axe.run(document)).violations")
        AUDITS.append((where, found))
        unlabelled = page.evaluate(UNLABELLED)
        assert unlabelled == [], f"{where}: form controls without a label: {unlabelled}"


def tab_walk(page, path, most=200):
    """Tab from the top of the page through its stops (at most `most`), until the focus leaves
    the page or comes back to the first: each stop shows its focus. How many there were."""
    page.evaluate("() => { document.activeElement && document.activeElement.blur(); window.__firstStop = null; }")
    for n in range(most):
        page.keyboard.press("Tab")
        now = page.evaluate(FOCUS_SHOWN)
        if now is None or now["again"]:
            return n
        assert now["shown"], f"{path}: {now['what']} has the focus and shows no outline"
    return most


def tab_until(page, test, most=80):
    """Tab until `test` (a script) holds for the focused element; whether it did."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if page.evaluate(test):
            return True
    return False


def route(path):
    """A page's route, its ids and query left out: one tab walk for each kind of page."""
    return re.sub(r"sha256:[0-9a-f]{64}|ws_[0-9a-f]+", "*", path.split("?")[0])


def accessibility(page):
    """Every page of the dashboard that a link reaches (from the navigation on, breadth first),
    the signed-out page and an error page, through axe: no critical or serious violation
    anywhere (the states the scenario stopped at, through shot(), were audited too), and every
    form control has a label. On each kind of page, every stop of the Tab key shows its focus.
    Then a token is made and revoked by keyboard alone."""
    if not AXE:
        return
    seen, queue, walked, stops = set(), ["/"], set(), 0
    while queue and len(seen) < 80:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        page.goto(BASE + path)
        audit(page, path)
        if route(path) not in walked:
            walked.add(route(path))
            stops += tab_walk(page, path)
        links = page.eval_on_selector_all(
            "a[href^='/']:not([download])", "as => as.map(a => a.getAttribute('href').split('#')[0])")
        queue += [h for h in links if h not in seen and not h.startswith(("/logout", "/login", "/assets/"))
                  and "/files/" not in h]
    assert {"/", "/library", "/imports", "/sets", "/registry", "/conflicts", "/approvals",
            "/workspaces", "/audit", "/tokens"} <= seen, seen
    assert any(p.startswith("/skills/") for p in seen) and any(p.startswith("/workspaces/ws_") for p in seen), seen
    # An error page, and the page a browser that is not signed in gets.
    page.goto(BASE + "/workspaces/ws_none")
    audit(page, "/workspaces/ws_none (an error)")
    stranger = page.context.browser.new_context()
    stranger.add_init_script(path=AXE)
    signed_out = stranger.new_page()
    signed_out.goto(BASE + "/")
    audit(signed_out, "/ (signed out)")
    stranger.close()

    # By keyboard alone: Tab to the token form's fields, type, choose, Enter; then Space on the
    # new token's Revoke button.
    page.goto(BASE + "/tokens")
    assert tab_until(page, "document.activeElement.name === 'name'"), "Tab never reaches the token's name"
    page.keyboard.type("keyboard-made")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.name") == "role"
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowUp")
    assert page.evaluate("document.activeElement.value") == "client"
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.innerText") == "Make token"
    page.keyboard.press("Enter")
    expect(page.get_by_role("status")).to_contain_text("Token keyboard-made made")
    secret = page.locator(".secret code").inner_text().strip()
    assert secret.startswith("cht_") and not refused(secret), secret
    assert tab_until(page, "document.activeElement.getAttribute('aria-label') === 'Revoke keyboard-made'"), \
        "Tab never reaches Revoke keyboard-made"
    page.keyboard.press("Space")
    expect(page.get_by_role("status")).to_contain_text("Token keyboard-made revoked")
    assert refused(secret)

    counts = {i: sum(1 for _, found in AUDITS for v in found if v["impact"] == i) for i in IMPACTS}
    print(f"axe: {len(AUDITS)} pages, {sum(counts.values())} violations "
          f"({counts['critical']} critical/{counts['serious']} serious/{counts['moderate']} moderate/{counts['minor']} minor); "
          f"{len(walked)} kinds of page walked by Tab, {stops} stops, each with its focus shown")
    for where, found in AUDITS:
        for v in found:
            nodes = "; ".join(n["html"][:100] for n in v["nodes"][:3])
            print(f"  {where}: [{v['impact']}] {v['id']} ({v['help']}): {nodes}")
    bad = [(where, v["id"]) for where, found in AUDITS for v in found if v["impact"] in ("critical", "serious")]
    assert bad == [], f"critical or serious accessibility violations: {bad}"


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=CONFIG["chromium"], args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    if AXE:
        page.context.add_init_script(path=AXE)
    PAGE = page
    try:
        # Nothing may be asked of any other address.
        outside = []
        page.on("request", lambda r: None if r.url.startswith(BASE) else outside.append(r.url))
        # Nor may a page log an error (a CSP violation, a failing script).
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))

        # The printed login link signs the browser in.
        page.goto(CONFIG["login"])
        assert page.url == BASE + "/", page.url
        assert page.get_by_role("heading", name="Overview").is_visible()
        shot(page, "overview")

        # Search the library and open the hostile skill.
        nav(page, "Library")
        page.get_by_role("searchbox", name="Search").fill("hostile")
        page.get_by_role("button", name="Search").click()
        shot(page, "library")
        # The skills that break the Agent Skills specification, each with its badge; a
        # skill's page names every problem.
        page.get_by_role("searchbox", name="Search").fill("")
        page.get_by_label("Breaking the specification").check()
        page.get_by_role("button", name="Search").click()
        row = page.get_by_role("row").filter(has_text="deploy-helper")
        expect(row).to_contain_text("5 problems")
        expect(page.get_by_role("row").filter(has_text="Tries to run in the dashboard")).to_have_count(0)
        shot(page, "library-problems")
        row.get_by_role("link", name="deploy-helper").click()
        for rule in ["name-form", "name-folder", "field-unknown", "field-client", "reference-missing"]:
            expect(page.locator("main li").filter(has_text=rule)).to_have_count(1)
        nav(page, "Library")
        page.get_by_role("searchbox", name="Search").fill("hostile")
        page.get_by_role("button", name="Search").click()
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
        # Text files show on the page, escaped; a binary one is offered for download.
        page.get_by_text("notes.html").click()
        expect(page.get_by_label("File notes.html")).to_have_text("<script>window.__pwned = 5</script>")
        expect(page.get_by_role("link", name="download")).to_have_attribute("href", re.compile("/files/logo.bin$"))
        # Clicking what was a javascript: link runs nothing.
        page.locator(".rendered").get_by_text("click me").click()
        assert page.evaluate("window.__pwned === undefined")
        shot(page, "skill")

        # Import a git toolkit and watch the job finish (live.js follows it, then reloads).
        nav(page, "Imports")
        expect(page.get_by_text("No import has ended yet.")).to_be_visible()
        form = page.get_by_role("region", name="Import a git toolkit")
        form.get_by_label("Repository URL").fill("https://localhost:1/team/kit.git")
        form.get_by_role("button", name="Import git toolkit").click()
        # Refused at the field, with nothing queued.
        expect(page.locator(".field-error")).to_contain_text("localhost")
        assert page.locator("tr[data-job]").count() == 0
        form = page.get_by_role("region", name="Import a git toolkit")
        form.get_by_label("Repository URL").fill(KIT)
        form.get_by_label("Commit").fill(FIRST)
        form.get_by_label("Instance id").fill("kit")
        form.get_by_role("button", name="Import git toolkit").click()
        # The job is still running when the page comes back; live.js follows it to its end
        # (nothing else reloads this page).
        expect(page.get_by_role("heading", name="Running")).to_be_visible()
        assert page.locator("tr[data-job][data-live]").count() == 1
        # live.js shows the job's phase as it works (the git server answers slowly): the
        # screenshot of a job in progress. A loaded machine can see the job end first; the
        # checks below hold either way.
        try:
            expect(page.locator('tr[data-job][data-live] [data-field="phase"]')).to_have_text(
                re.compile("fetching|staging"), timeout=10000)
            shot(page, "import-running")
        except AssertionError:
            print("the import ended before live.js showed its phase: no screenshot of it")
        history = page.get_by_role("table").last
        expect(history.locator("tr[data-job]").first).to_contain_text("done", timeout=60000)
        assert page.locator("tr[data-job][data-live]").count() == 0
        expect(history).to_contain_text("3 skills at " + FIRST[:12])
        shot(page, "imports")

        # A set with include/exclude, previewed before it is saved.
        nav(page, "Sets")
        expect(page.get_by_text("No set yet.")).to_be_visible()
        page.get_by_role("link", name="New set").click()
        page.get_by_label("Set id").fill("team")
        page.get_by_label("Description").fill("The team's review tools")
        m = page.get_by_role("group", name="Member 1")
        m.get_by_label("Toolkit").select_option("git")
        m.get_by_label("Git URL").fill(KIT)
        m.get_by_label("Commit").fill(FIRST)
        m.get_by_label("Instance id").fill("kit")
        m.get_by_label("Include").fill("lint, fmt")
        m.get_by_label("Exclude").fill("fmt")
        page.get_by_role("button", name="Preview").click()
        preview = page.get_by_role("region", name="Preview")
        expect(preview).to_contain_text("No conflict")
        drawing = preview.locator("table.tiers")
        expect(drawing.get_by_role("row", name=re.compile("^lint"))).to_contain_text("serves")
        for absent in ["fmt", "review"]:
            assert drawing.get_by_role("rowheader", name=absent, exact=True).count() == 0, absent
        shot(page, "set-preview")
        # Nothing is saved by a preview.
        assert api("/api/v1/sets")["sets"] == []
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_role("heading", name="Set team")).to_be_visible()
        # A second revision takes fmt back; the revisions say what changed.
        page.get_by_role("group", name="Member 1").get_by_label("Exclude").fill("")
        page.get_by_role("button", name="Save").click()
        expect(page.locator("ol.revisions > li")).to_have_count(2)
        changes = page.locator("table.changes").first
        expect(changes.get_by_role("row", name=re.compile("kit skills.exclude"))).to_contain_text('["fmt"]')
        shot(page, "sets")
        # What the second revision changes for the skills: fmt served again.
        page.get_by_role("button", name="Compare the skills of revisions 1 and 2").click()
        expect(page.get_by_role("status")).to_contain_text("Revision 1 to revision 2: 1 added, 0 removed")
        expect(page.get_by_role("article", name="fmt added")).to_be_visible()
        audit(page, "set diff")
        page.get_by_role("link", name="Back to the set").click()
        # A label on the set: stable at revision 2, then 1, rolled back to 2; a revision the
        # set does not have is said on its page.
        for label_revision, revision in [("1", "2"), ("2", "1")]:
            move = page.get_by_role("form", name="Move a label")
            move.get_by_label("Label", exact=True).fill("stable")
            move.get_by_label("Revision of the set", exact=True).fill(revision)
            move.get_by_role("button", name="Move label").click()
            expect(page.get_by_role("row", name=re.compile(f"^stable {label_revision} {revision} none"))).to_be_visible()
        move = page.get_by_role("form", name="Move a label")
        move.get_by_label("Label", exact=True).fill("stable")
        move.get_by_label("Revision of the set", exact=True).fill("9")
        move.get_by_role("button", name="Move label").click()
        expect(page.get_by_role("alert")).to_contain_text("no revision 9")
        expect(page.get_by_role("heading", name="Set team")).to_be_visible()
        page.get_by_role("button", name="Roll back stable").click()
        expect(page.get_by_role("status")).to_contain_text("Rolled back: stable points where it did before (label revision 3)")
        audit(page, "set label rolled back")
        assert api("/api/v1/sets/team/labels")["labels"][0]["value"] == "2"
        page.get_by_role("link", name="Back to the set").click()

        # Open a workspace of the set through MCP; it shows with its tiers.
        opened = mcp_ok("workspace_open", {"idempotencyKey": "dash-set", "toolkits": [{"kind": "set", "id": "team"}]})
        ws = opened["workspace"]
        nav(page, "Workspaces")
        page.get_by_role("link", name=ws).click()
        drawing = page.locator("table.tiers")
        lint = drawing.get_by_role("row", name=re.compile("^lint"))
        expect(lint.locator("td").nth(1)).to_contain_text("serves")
        expect(drawing.get_by_role("row", name=re.compile("^fmt"))).to_contain_text("owner:kit")
        assert drawing.get_by_role("rowheader", name="review", exact=True).count() == 0
        shot(page, "workspace")

        # A launch conflict through MCP, settled on the Conflicts page: the same request opens.
        conflict = {"idempotencyKey": "dash-conflict", "toolkits": [CONFIG["one"], CONFIG["two"]]}
        err, out = mcp("workspace_open", conflict)
        assert err and out["code"] == "CONFLICT", out
        nav(page, "Conflicts")
        section = page.get_by_role("region", name=re.compile("^dup"))
        expect(section.locator("pre.diff del")).to_contain_text("One's copy.")
        expect(section.locator("pre.diff ins")).to_contain_text("Two's copy.")
        assert section.locator("article.candidate").count() == 2
        shot(page, "conflicts")
        section.get_by_role("button", name="Choose owner:two").click()
        expect(page.get_by_text("No launch conflict waits.")).to_be_visible()
        settled = mcp_ok("workspace_open", conflict)
        read = mcp_ok("skills_read", {"workspace": settled["workspace"], "skill": "dup"})
        assert "Two's copy." in json.dumps(read), read
        # The losing copy's page names the other copy and the workspace that serves it.
        nav(page, "Library")
        page.get_by_role("searchbox", name="Search").fill("one")
        page.get_by_role("button", name="Search").click()
        page.get_by_role("link", name="dup").click()
        row = page.get_by_role("row", name=re.compile(settled["workspace"]))
        expect(row).to_contain_text("owner:two")
        expect(row).to_contain_text("shadowed")
        # Its drawing marks the override's winner and the copy it set aside.
        nav(page, "Workspaces")
        page.get_by_role("link", name=settled["workspace"]).click()
        dup = page.locator("table.tiers").get_by_role("row", name=re.compile("^dup"))
        expect(dup.locator("td").nth(1)).to_contain_text("serves (override) owner:two")
        expect(dup.locator("td").nth(1)).to_contain_text("set aside by override owner:one")
        shot(page, "workspace-override")

        # A run refused for want of an approval, approved on the page: skills_run passes.
        scripted = mcp_ok("workspace_open", {"idempotencyKey": "dash-run", "toolkits": [CONFIG["scripted"]]})
        run = {"workspace": scripted["workspace"], "skill": "alpha", "script": "scripts/hello.sh"}
        err, out = mcp("skills_run", run)
        assert err and out["code"] == "FORBIDDEN", out
        nav(page, "Approvals")
        expect(page.get_by_label("Script scripts/hello.sh")).to_contain_text("echo hello from alpha")
        shot(page, "approvals")
        page.get_by_role("button", name="Approve alpha").click()
        expect(page.get_by_text("No run waits for an approval.")).to_be_visible()
        ran = mcp_ok("skills_run", run)
        assert "hello from alpha" in ran["stdout"], ran

        # Usage: the run and the read just made are on the page once flushed (every second
        # here), in the chart and in their skills' rows.
        nav(page, "Usage")
        alpha = page.get_by_role("row", name=re.compile("^alpha "))
        for _ in range(40):
            if alpha.count() == 1 and page.get_by_role("row", name=re.compile("^dup ")).count() == 1:
                break
            time.sleep(0.5)
            page.reload()
        cells = alpha.locator("td")
        # Toolkit, reads, resource reads, mount loads, runs, failed runs, last used,
        # principals, workspaces.
        assert cells.nth(4).inner_text() == "1", alpha.inner_text()
        assert cells.nth(5).inner_text() == "0 of 1 (0%)", alpha.inner_text()
        assert cells.nth(7).inner_text() == "1", alpha.inner_text()
        dup = page.get_by_role("row", name=re.compile("^dup "))
        assert dup.locator("td").nth(1).inner_text() == "1", dup.inner_text()
        chart = page.get_by_role("img", name=re.compile("^Uses per day from"))
        label = chart.get_attribute("aria-label")
        assert re.search(r"[1-9]\d* reads, .* [1-9]\d* runs$", label), label
        assert page.locator("figure.chart g.day").count() == 30
        shot(page, "usage")
        # Never used in the last 7 days: the hostile kit's skills, not alpha.
        filters = page.locator("form.filters")
        filters.get_by_label("Period").select_option("7")
        filters.get_by_label("Show").select_option("unused")
        filters.get_by_role("button", name="Show").click()
        expect(page.get_by_role("rowheader", name="hostile", exact=True)).to_be_visible()
        assert page.get_by_role("rowheader", name="alpha", exact=True).count() == 0
        assert page.locator("figure.chart g.day").count() == 7
        assert "show=unused" in page.url and "days=7" in page.url, page.url
        shot(page, "usage-unused")

        # The registry: add an entry pinned at the first commit, find the newer head, move the
        # pin to it and roll it back.
        nav(page, "Registry")
        add = page.get_by_role("form", name="Add an entry")
        add.get_by_label("Id").fill("team/kit")
        add.get_by_label("Name", exact=True).fill("Team kit")
        add.get_by_label("Description").fill("The team's own skills")
        add.get_by_label("Repository URL").fill(KIT)
        add.get_by_label("Commit to pin").fill(FIRST)
        add.get_by_role("button", name="Add entry").click()
        expect(page.get_by_role("heading", name="team/kit")).to_be_visible()
        # A workspace opened on the entry serves its pin.
        on_pin = mcp_ok("workspace_open", {"idempotencyKey": "dash-on-pin", "toolkits": [{"kind": "preset", "id": "team/kit"}]})
        page.get_by_role("button", name="Check for updates").click()
        expect(page.get_by_role("status")).to_contain_text(SECOND)
        # Before the move, what it changes: triage added, lint changed (its SKILL.md and a
        # script); the workspace opened on the entry serves the pin until it reopens.
        page.get_by_role("button", name="Compare the head with the pin").click()
        expect(page.get_by_role("status")).to_contain_text("1 added, 0 removed, 0 renamed, 1 changed, 2 unchanged")
        triage = page.get_by_role("article", name="triage added")
        expect(triage.locator(".badge")).to_have_text("added")
        lint = page.get_by_role("article", name="lint changed")
        expect(lint.locator("pre.diff")).to_contain_text("+Run `scripts/lint.sh` on the changed files.")
        expect(lint.get_by_role("row", name=re.compile("^scripts.lint.sh script added"))).to_contain_text(re.compile(r"– → 25\s*executable"))
        assert page.locator("article.skill-change").count() == 2
        expect(page.locator("ul.serving")).to_contain_text(on_pin["workspace"])
        assert api("/api/v1/registry/team/kit")["entry"]["pin"]["commit"] == FIRST
        shot(page, "registry-diff")
        confirm = page.get_by_role("form", name="Confirm the move")
        confirm.get_by_label("Reason").fill("takes triage")
        confirm.get_by_role("button", name="Move the pin to").click()
        expect(page.get_by_role("status")).to_contain_text("Pinned at " + SECOND)
        page.get_by_role("button", name="Roll back to the previous pin").click()
        expect(page.get_by_role("status")).to_contain_text("Rolled back: pinned at " + FIRST)
        assert api("/api/v1/registry/team/kit")["entry"]["pin"]["commit"] == FIRST
        # A label: stable at the second commit with the first as a canary for a quarter of new
        # workspaces; moved again without one, then rolled back to it.
        move = page.get_by_role("form", name="Move a label")
        move.get_by_label("Label", exact=True).fill("stable")
        move.get_by_label("Commit", exact=True).fill(SECOND)
        move.get_by_label("Canary commit (optional)").fill(FIRST)
        move.get_by_label("Canary share, percent").fill("25")
        move.get_by_role("button", name="Move label").click()
        expect(page.get_by_role("status")).to_contain_text("The label stable is at label revision 1")
        row = page.get_by_role("row", name=re.compile("^stable 1"))
        expect(row).to_contain_text(SECOND[:12])
        expect(row).to_contain_text(FIRST[:12] + " to 25%")
        expect(row.get_by_role("button", name="Roll back stable")).to_be_disabled()
        on_label = mcp_ok("workspace_open", {"idempotencyKey": "dash-on-label", "toolkits": [{"kind": "preset", "id": "team/kit", "label": "stable"}]})
        taken = on_label["toolkits"][0]
        assert taken["label"]["name"] == "stable" and taken["label"]["revision"] == 1, taken
        assert taken["commit"] == (FIRST if taken["label"].get("canary") else SECOND), taken
        move = page.get_by_role("form", name="Move a label")
        move.get_by_label("Label", exact=True).fill("stable")
        move.get_by_label("Commit", exact=True).fill(FIRST)
        move.get_by_role("button", name="Move label").click()
        expect(page.get_by_role("status")).to_contain_text("The label stable is at label revision 2")
        expect(page.get_by_role("row", name=re.compile("^stable 2"))).to_contain_text("none")
        page.get_by_role("button", name="Roll back stable").click()
        expect(page.get_by_role("status")).to_contain_text("Rolled back: stable points where it did before (label revision 3)")
        assert api("/api/v1/registry/team/kit")["entry"]["labels"]["stable"] == {"revision": 3, "value": SECOND, "canary": {"value": FIRST, "percent": 25}}
        audit(page, "registry with labels")
        shot(page, "registry-labels")
        nav(page, "Registry")
        shot(page, "registry")

        # Make a client token, see its secret once, revoke it: its next call is refused.
        nav(page, "Tokens")
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
        nav(page, "Audit")
        page.get_by_label("Action").fill("token.revoke")
        page.get_by_role("button", name="Filter").click()
        assert page.locator("tbody tr").count() == 1
        assert "token:browser-made" in page.locator("tbody").inner_text()
        shot(page, "audit")

        # Close the set's workspace from its page: it is gone for MCP too.
        nav(page, "Workspaces")
        shot(page, "workspaces")
        page.get_by_role("button", name="Close " + ws).click()
        expect(page.get_by_role("link", name=ws)).to_have_count(0)
        err, out = mcp("skills_list", {"workspace": ws})
        assert err and out["code"] == "NOT_FOUND", out

        # The overview, now that there is something to see.
        nav(page, "Overview")
        shot(page, "overview")

        # A narrow window still reads.
        page.set_viewport_size({"width": 420, "height": 800})
        page.goto(BASE + "/library")
        assert page.get_by_role("searchbox", name="Search").is_visible()
        # By keyboard alone: the search box, typed into, Enter.
        page.get_by_role("searchbox", name="Search").focus()
        page.keyboard.type("lint")
        page.keyboard.press("Enter")
        expect(page.get_by_role("link", name="lint", exact=True).first).to_be_visible()
        assert "q=lint" in page.url, page.url
        # No page is wider than the window (wide tables scroll inside themselves).
        for path in ["/", "/library", "/usage", "/imports", "/sets/team", "/registry", "/conflicts",
                     "/approvals", "/workspaces", "/workspaces/" + settled["workspace"], "/audit", "/tokens"]:
            page.goto(BASE + path)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 420, f"{path} is {width} px wide"
            audit(page, f"{path} at 420 px")
        shot(page, "narrow-workspace")

        # The session's cookie, as chromium keeps it from http://127.0.0.1 (loopback is a
        # secure context): __Host-, Secure, HttpOnly, SameSite=Strict, for every path.
        [session] = [c for c in page.context.cookies() if c["name"].endswith("ch_session")]
        assert session["name"] == "__Host-ch_session", session
        assert session["secure"] and session["httpOnly"], session
        assert (session["sameSite"], session["path"]) == ("Strict", "/"), session
        page.set_viewport_size({"width": 1280, "height": 800})

        # Accessibility: axe on every page, focus shown, labels, a form by keyboard alone.
        accessibility(page)

        # Signing out (a form with the session's CSRF token) ends it.
        page.goto(BASE + "/tokens")
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_text("Not signed in.")).to_be_visible()
        page.goto(BASE + "/library")
        assert page.url == BASE + "/", page.url
        assert not [c for c in page.context.cookies() if c["name"].endswith("ch_session")]

        assert outside == [], outside
        # The hostile skill page's blocked image and the refused forms are the only errors.
        unexpected = [e for e in errors if "Failed to load resource" not in e]
        assert unexpected == [], unexpected
    except Exception:
        # What the page said when the scenario failed.
        print("failed at", page.url, file=sys.stderr)
        print(page.locator("main").inner_text(), file=sys.stderr)
        raise
    browser.close()
print("dashboard: ok")

package web_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/nodepool-nats/nodepool/kv"
)

// boardConfig has two providers of two pools each.
const boardConfig = `
labels:
  - name: small
  - name: big
providers:
  - name: east
    driver: fake
    pools:
      - name: main
        max-servers: 20
        labels: [small, big]
      - name: spare
        max-servers: 5
        labels: [small]
  - name: west
    driver: fake
    pools:
      - name: main
        max-servers: 20
        labels: [small, big]
      - name: spare
        labels: [big]
`

// launcherRecord is a live launcher serving every pool of boardConfig;
// east/main waits for quota when paused.
func launcherRecord(paused bool) kv.Component {
	now := time.Now().UTC()
	var pools []kv.ComponentPool
	for _, p := range []string{"east/main", "east/spare", "west/main", "west/spare"} {
		prov, pool, _ := strings.Cut(p, "/")
		pools = append(pools, kv.ComponentPool{Provider: prov, Pool: pool, Labels: []string{"small", "big"}, Paused: paused && p == "east/main"})
	}
	return kv.Component{ID: "launcher-1", Roles: []string{"launcher"}, Hostname: "host1", Version: "dev",
		Started: now.Add(-3 * time.Hour), Heartbeat: now, Pools: pools}
}

// navigate opens a page of the dashboard and waits for its first data.
func navigate(t *testing.T, ctx context.Context, url string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the first data", `document.body.dataset.loaded === "true"`)
}

// text returns the text of the first element a selector finds ("" if
// none).
func text(t *testing.T, ctx context.Context, selector string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector(%q)?.innerText ?? ""`, selector)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The page says it is loading until the first data is in, rather than
// "No nodes" and "None alive"; its load event comes once the data is
// shown, so a browser that waits for the load sees the fleet.
func TestDashboardLoadingUntilFirstData(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	b := startBoardWith(t, boardConfig, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/dashboard/snapshot.js" || r.URL.Path == "/dashboard/events" {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	})
	now := time.Now().UTC()
	b.component(launcherRecord(false))
	b.node(kv.Node{ID: "n-ready", State: kv.NodeReady, Labels: []string{"small"}, Provider: "east", Pool: "main", Launcher: "launcher-1", Created: now, StateTime: now})
	b.synced(1, 0)
	ctx := browser(t)
	// Navigate without waiting for the load: it waits for the data.
	if _, err := chromedp.Run(ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.Navigate, page.NavigateParams{URL: b.http.URL + "/dashboard/"})
		return err
	})); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the page saying it loads", `!!document.getElementById("loading") && !document.getElementById("loading").hidden && /Loading/.test(document.getElementById("loading").innerText)`)
	loading, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.readyState + " " + document.body.dataset.loaded + "\n" + document.body.innerText`))
	if err != nil {
		t.Fatal(err)
	}
	for _, wrong := range []string{"No nodes", "None alive", "No requests", "Nothing failing", "No pools"} {
		if strings.Contains(loading, wrong) {
			t.Errorf("while loading, the page says %q:\n%s", wrong, loading)
		}
	}
	if state := strings.SplitN(loading, "\n", 2)[0]; state != "loading false" && state != "interactive false" {
		t.Errorf("while the first data is not in, the page is %q; want it still loading, not loaded", state)
	}
	screenshot(t, ctx, "loading")
	close(release)
	waitJS(t, ctx, "the data, then the load event",
		`document.body.dataset.loaded === "true" && document.readyState === "complete" && document.getElementById("loading").hidden && !!document.querySelector('#nodes [data-node-id="n-ready"]')`)
	waitJS(t, ctx, "the live launcher", `!!document.querySelector('#components [data-component-id="launcher-1"]')`)
}

// chromium --headless --dump-dom and --screenshot finish (the event
// stream does not keep the page loading) and show the fleet, not a page
// still loading.
func TestDashboardHeadlessDumpAndScreenshot(t *testing.T) {
	t.Parallel()
	// The event stream sends nothing: what the page shows when loaded
	// came before its load event.
	b := startBoardWith(t, boardConfig, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/dashboard/events" {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	now := time.Now().UTC()
	b.component(launcherRecord(false))
	b.node(kv.Node{ID: "n-ready", State: kv.NodeReady, Labels: []string{"small"}, Provider: "east", Pool: "main", Launcher: "launcher-1", Created: now, StateTime: now})
	b.synced(1, 0)
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed: the dashboard test drives it headless; install it with `apt-get install -y chromium` (.ci/run does)")
	}
	run := func(args ...string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
		defer cancel()
		args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + t.TempDir(),
			"--disable-quic", "--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--disable-dev-shm-usage", "--no-first-run", "--hide-scrollbars"}, args...)
		out, err := exec.CommandContext(ctx, path, append(args, b.http.URL+"/dashboard/")...).Output()
		if ctx.Err() != nil {
			t.Fatalf("chromium %s did not finish within 90 s: the page never ends loading", strings.Join(args, " "))
		}
		if err != nil {
			t.Fatalf("chromium %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	dom := run("--dump-dom")
	if !strings.Contains(dom, `data-loaded="true"`) || !strings.Contains(dom, `data-node-id="n-ready"`) {
		t.Errorf("--dump-dom shows the page before its data:\n%s", dom)
	}
	png := filepath.Join(t.TempDir(), "dashboard.png")
	run("--screenshot="+png, "--window-size=1280,1000")
	data, err := os.ReadFile(png)
	if err != nil || len(data) < 1000 || string(data[1:4]) != "PNG" {
		t.Fatalf("--screenshot wrote %d bytes (%v)", len(data), err)
	}
	if dir := os.Getenv("NODEPOOL_TEST_SCREENSHOTS"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, t.Name()+".png"), data, 0o644)
	}
}

// What a page shows of records in particular states, each checked on its
// own: a building node's attempt and last error, a pool waiting for
// quota in those words, "declined by" only on requests that still wait
// or failed, times in words, ids on one line.
func TestDashboardShowsRecordsInWords(t *testing.T) {
	t.Parallel()
	b := startBoard(t, boardConfig)
	now := time.Now().UTC()
	longID := strings.Repeat("x", 20) + "-a-request-id-long-enough-to-wrap-" + strings.Repeat("y", 10)
	b.component(launcherRecord(true))
	expiry := now.Add(time.Hour + 58*time.Minute + 30*time.Second)
	created := now.Add(-3*time.Minute - 5*time.Second)
	for _, n := range []kv.Node{
		{ID: "n-build", State: kv.NodeBuilding, Labels: []string{"small"}, Provider: "east", Pool: "main", Launcher: "launcher-1", Attempt: 3,
			Reason: "instance i-123 went to ERROR while booting", AllocatedTo: longID, Created: created, StateTime: created},
		{ID: "n-held", State: kv.NodeHold, Labels: []string{"big"}, Provider: "west", Pool: "main", HoldJob: "tenant/project/job",
			Comment: "debugging a flaky test", HoldExpiration: &expiry, Created: created, StateTime: now},
		{ID: "n-ready", State: kv.NodeReady, Labels: []string{"small"}, Provider: "east", Pool: "main", Launcher: "launcher-1", Created: created, StateTime: now},
		{ID: "n-ready2", State: kv.NodeReady, Labels: []string{"small"}, Provider: "east", Pool: "main", Launcher: "launcher-1", Created: created, StateTime: now},
	} {
		b.node(n)
	}
	for _, r := range []kv.Request{
		{ID: longID, State: kv.RequestRequested, Labels: []string{"small"}, DeclinedBy: []string{"west/main"}, Priority: 100,
			Reason: "waiting in pool east/main: for its quota: 2 of 2 servers in use, needs 1 more (max-servers, max-cores, max-ram)", Created: now, StateTime: now},
		{ID: "done-1", State: kv.RequestFulfilled, Labels: []string{"small"}, Nodes: []string{"n-ready"}, DeclinedBy: []string{"west/main"},
			Provider: "east", Pool: "main", Priority: 100, Created: now.Add(-5 * time.Second), StateTime: now},
	} {
		b.request(r)
	}
	b.synced(4, 2)
	ctx := browser(t)
	if _, err := chromedp.Run(ctx, chromedp.EmulateViewport(900, 1200)); err != nil {
		t.Fatal(err)
	}
	navigate(t, ctx, b.http.URL+"/dashboard/")
	screenshot(t, ctx, "records")

	t.Run("building node shows its attempt and last error", func(t *testing.T) {
		row := text(t, ctx, `#nodes [data-node-id="n-build"]`)
		if !strings.Contains(row, "attempt 3") || !strings.Contains(row, "last error: instance i-123 went to ERROR while booting") {
			t.Errorf("the building node's row: %q", row)
		}
	})
	t.Run("pool waiting for quota says so", func(t *testing.T) {
		row := text(t, ctx, `#capacity [data-pool="east/main"]`)
		if !strings.Contains(row, "waiting for quota") || !strings.Contains(row, "for its quota: 2 of 2 servers in use") {
			t.Errorf("east/main's capacity row: %q", row)
		}
		att := text(t, ctx, `#attention [data-quota-pool="east/main"]`)
		if !strings.Contains(att, "waiting for quota") || !strings.Contains(att, "1 request waiting") {
			t.Errorf("east/main in the attention panel: %q", att)
		}
		for _, sel := range []string{"#capacity", "#attention", "#components"} {
			if s := text(t, ctx, sel); regexp.MustCompile(`\bpaused\b`).MatchString(s) {
				t.Errorf("%s calls the pool waiting for quota paused (the word image pause uses):\n%s", sel, s)
			}
		}
		if s := text(t, ctx, `#components [data-component-id="launcher-1"]`); !strings.Contains(s, "east/main waiting for quota") {
			t.Errorf("the launcher's pools: %q", s)
		}
	})
	t.Run("declined by only while waiting", func(t *testing.T) {
		if s := text(t, ctx, `#requests [data-request-id="done-1"]`); strings.Contains(s, "declined") || s == "" {
			t.Errorf("the fulfilled request's row: %q; want no word of who declined it", s)
		}
		if s := text(t, ctx, fmt.Sprintf(`#requests [data-request-id=%q]`, longID)); !strings.Contains(s, "declined by west/main") {
			t.Errorf("the waiting request's row: %q; want who declined it", s)
		}
	})
	t.Run("times in words", func(t *testing.T) {
		if s := text(t, ctx, `#attention [data-node-id="n-held"]`); !regexp.MustCompile(`expires in 1h 5[0-8]m\b`).MatchString(s) {
			t.Errorf("the held node: %q; want it to expire in 1h 58m", s)
		}
		if s := text(t, ctx, `#nodes [data-node-id="n-build"]`); !regexp.MustCompile(`\b3m( \d+s)? ago\b`).MatchString(s) {
			t.Errorf("the building node: %q; want it created 3m ago", s)
		}
		if s := text(t, ctx, `#components [data-component-id="launcher-1"]`); !strings.Contains(s, "3h") {
			t.Errorf("the launcher: %q; want it up 3h", s)
		}
		noRawTimes(t, ctx)
	})
	t.Run("ids do not wrap", func(t *testing.T) {
		lines, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](fmt.Sprintf(`[
			document.querySelector('#requests [data-request-id=%q] td:first-child span.id'),
			document.querySelector('#nodes [data-node-id="n-build"] td:first-child span.id'),
			document.querySelector('#nodes [data-node-id="n-build"] td:nth-child(6) span.id'),
		].map((el) => Math.round(el.getBoundingClientRect().height / parseFloat(getComputedStyle(el).lineHeight)))`, longID)))
		if err != nil {
			t.Fatal(err)
		}
		for i, n := range lines {
			if n != 1 {
				t.Errorf("id %d is on %d lines; want 1 (%v)", i, n, lines)
			}
		}
	})
}

// The filters (provider, label, state, id) narrow the capacity, labels,
// requests and nodes; they live in the address, so a filtered view can
// be linked to, and a count is a link to the nodes it counts.
func TestDashboardFilters(t *testing.T) {
	t.Parallel()
	b := startBoard(t, boardConfig)
	now := time.Now().UTC()
	b.component(launcherRecord(false))
	want := map[string]int{}
	n := 0
	for _, prov := range []string{"east", "west"} {
		for _, label := range []string{"small", "big"} {
			for i, st := range []kv.NodeState{kv.NodeReady, kv.NodeReady, kv.NodeInUse, kv.NodeFailed, kv.NodeBuilding} {
				id := fmt.Sprintf("%s-%s-%d", prov, label, i)
				b.node(kv.Node{ID: id, State: st, Labels: []string{label}, Provider: prov, Pool: "main", Launcher: "launcher-1",
					Reason: "boom", Attempt: 1, Created: now.Add(time.Duration(n) * time.Millisecond), StateTime: now})
				want[prov+" "+label+" "+string(st)]++
				n++
			}
		}
	}
	b.request(kv.Request{ID: "req-small", State: kv.RequestPending, Labels: []string{"small"}, Provider: "east", Pool: "main", Created: now, StateTime: now})
	b.request(kv.Request{ID: "req-big", State: kv.RequestPending, Labels: []string{"big"}, Provider: "west", Pool: "main", Created: now, StateTime: now})
	b.synced(n, 2)
	ctx := browser(t)
	navigate(t, ctx, b.http.URL+"/dashboard/#provider=west&state=failed")
	rows := func() []string {
		t.Helper()
		out, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#nodes tbody tr')].map((r) => r.dataset.provider + " " + r.dataset.label + " " + r.dataset.state)`))
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := rows(); len(got) != 2 || got[0] != "west big failed" && got[0] != "west small failed" || strings.Split(got[1], " ")[0] != "west" {
		t.Errorf("#provider=west&state=failed shows %v; want west's two failed nodes", got)
	}
	if s := text(t, ctx, `[data-pager="nodes"]`); !strings.Contains(s, "2 matching (of 20)") {
		t.Errorf("the pager says %q", s)
	}
	if s := text(t, ctx, "#capacity"); strings.Contains(s, "east") {
		t.Errorf("the capacity shows east under a filter for west:\n%s", s)
	}
	// The label's select, as a user would.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const s = document.querySelector('#filters [name="label"]'); s.value = "big"; s.dispatchEvent(new Event("input", {bubbles: true})); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "west's failed big nodes", `[...document.querySelectorAll('#nodes tbody tr')].map((r) => r.dataset.node_id ?? r.dataset.nodeId).join() === "west-big-3"`)
	if s := text(t, ctx, "#requests"); !strings.Contains(s, "No request matches the filters") {
		t.Errorf("the requests under a filter for failed: %q; want none (none failed)", s)
	}
	if loc, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash`)); err != nil || loc != "#provider=west&label=big&state=failed" {
		t.Errorf("the address: %q (%v)", loc, err)
	}
	screenshot(t, ctx, "filtered")
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const s = document.querySelector('#filters [name="state"]'); s.value = ""; s.dispatchEvent(new Event("input", {bubbles: true})); return true; })()`)); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "west's big nodes and request", `document.querySelectorAll('#nodes tbody tr').length === 5 && [...document.querySelectorAll('#requests tbody tr')].map((r) => r.dataset.requestId).join() === "req-big"`)
	// Clear, then follow a count: east/main's ready nodes.
	if _, err := chromedp.Run(ctx, chromedp.Click(chromedp.CSS(`#filters button[type="reset"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "every node", `document.querySelectorAll('#nodes tbody tr').length === 20`)
	if _, err := chromedp.Run(ctx, chromedp.Click(chromedp.CSS(`#capacity [data-pool="east/main"] [data-count-state="ready"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "east's ready nodes", `[...document.querySelectorAll('#nodes tbody tr')].every((r) => r.dataset.provider === "east" && r.dataset.state === "ready") && document.querySelectorAll('#nodes tbody tr').length === 4`)
	// The id search.
	navigate(t, ctx, b.http.URL+"/dashboard/#q=west-small-4")
	waitJS(t, ctx, "one node", `[...document.querySelectorAll('#nodes tbody tr')].map((r) => r.dataset.nodeId).join() === "west-small-4"`)
}

// With 10,000 nodes the page shows counts per pool, label and state and a
// page of the node table, not every node: it is drawn within a bound,
// measured by the page itself, and its document stays small. A change
// redraws it quickly.
func TestDashboardTenThousandNodes(t *testing.T) {
	t.Parallel()
	const total = 10000
	b := startBoard(t, boardConfig)
	b.component(launcherRecord(false))
	now := time.Now().UTC()
	states := []kv.NodeState{kv.NodeReady, kv.NodeInUse, kv.NodeInUse, kv.NodeInUse, kv.NodeBuilding, kv.NodeDeleting, kv.NodeUsed, kv.NodeFailed}
	pools := []string{"east/main", "east/spare", "west/main", "west/spare"}
	for i := range total {
		prov, pool, _ := strings.Cut(pools[i%len(pools)], "/")
		label := []string{"small", "big"}[i/len(pools)%2]
		n := kv.Node{ID: fmt.Sprintf("node-%05d", i), State: states[i%len(states)], Labels: []string{label}, Provider: prov, Pool: pool,
			Launcher: "launcher-1", ExternalID: fmt.Sprintf("i-%08x", i), InterfaceIP: fmt.Sprintf("10.0.%d.%d", i/256, i%256), Attempt: 1,
			Resources: kv.Resources{Cores: 2, RAM: 4096, Instances: 1}, Created: now.Add(-time.Duration(i) * time.Second), StateTime: now}
		switch n.State {
		case kv.NodeInUse:
			n.AllocatedTo, n.Holder = fmt.Sprintf("req-%05d", i), "zuul"
		case kv.NodeBuilding:
			n.Attempt, n.Reason = 2, "instance went to ERROR while booting"
		case kv.NodeFailed:
			n.Attempt, n.Reason = 3, "launch failed after 3 attempt(s): quota exceeded"
		}
		b.putAsync(n)
	}
	b.flush()
	b.synced(total, 0)
	// A page that draws every node would take minutes: fail in a bounded
	// time instead.
	ctx, cancel := context.WithTimeout(browser(t), 3*time.Minute)
	defer cancel()
	navigate(t, ctx, b.http.URL+"/dashboard/")
	type stats struct {
		FirstRender  float64 `json:"firstRender"`
		LastRenderMs float64 `json:"lastRenderMs"`
		MaxRenderMs  float64 `json:"maxRenderMs"`
		Renders      int     `json:"renders"`
		Elements     int     `json:"elements"`
		Rows         int     `json:"rows"`
	}
	read := func() stats {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[stats](`({...window.nodepoolStats, elements: document.getElementsByTagName("*").length, rows: document.querySelectorAll("#nodes tbody tr").length})`))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	first := read()
	t.Logf("10,000 nodes: first render done %.0f ms after the navigation began (the render itself %.0f ms); %d elements in the document, %d node rows",
		first.FirstRender, first.MaxRenderMs, first.Elements, first.Rows)
	// Bounds with room for a busy 2-core machine; an idle one is far
	// below (see docs/operations.md).
	if first.FirstRender > 15000 {
		t.Errorf("the first render was done %.0f ms after the navigation began; want within 15 s", first.FirstRender)
	}
	if first.Elements > 4000 || first.Rows != 100 {
		t.Errorf("%d elements, %d node rows; want at most 4,000 and one page of 100", first.Elements, first.Rows)
	}
	if s := text(t, ctx, "#summary"); !strings.Contains(s, "10,000 nodes") {
		t.Errorf("the summary: %q", s)
	}
	if s := text(t, ctx, `#capacity [data-pool="east/main"]`); !strings.Contains(s, "2,500 / 20 servers") {
		t.Errorf("east/main's capacity: %q", s)
	}
	if s := text(t, ctx, `[data-pager="nodes"]`); !strings.Contains(s, "1–100 of 10,000") || !strings.Contains(s, "page 1 of 100") {
		t.Errorf("the pager: %q", s)
	}
	screenshot(t, ctx, "10000-top")
	// A change: the page follows it, redrawing within a bound.
	waitJS(t, ctx, "the event stream", `document.getElementById("conn").dataset.state === "live"`)
	e, err := b.b.Nodes.Get(t.Context(), "node-00000")
	if err != nil {
		t.Fatal(err)
	}
	changed := e.Value
	changed.State = kv.NodeHold
	changed.Comment = "held at ten thousand"
	if _, err := b.b.Nodes.Update(t.Context(), changed.ID, &changed, e.Revision); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the held node", `document.querySelector('#attention [data-node-id="node-00000"]')?.innerText.includes("held at ten thousand")`)
	after := read()
	t.Logf("after a change: %d renders, the last %.0f ms, the longest %.0f ms; %d elements", after.Renders, after.LastRenderMs, after.MaxRenderMs, after.Elements)
	if after.LastRenderMs > 2000 || after.Elements > 4000 {
		t.Errorf("a redraw took %.0f ms with %d elements; want within 2 s and 4,000", after.LastRenderMs, after.Elements)
	}
	// The next page.
	if _, err := chromedp.Run(ctx, chromedp.Click(chromedp.CSS(`[data-pager="nodes"] button[data-page="1"]`))); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the second page", `/101–200 of 10,000/.test(document.querySelector('[data-pager="nodes"]').innerText) && document.querySelectorAll('#nodes tbody tr').length === 100`)
	screenshot(t, ctx, "10000-nodes", "#nodes")
}

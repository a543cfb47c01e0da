package web_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/nodepool-nats/nodepool/events"
	"github.com/nodepool-nats/nodepool/kv"
)

// browser starts Debian's chromium headless for a test. The test fails,
// saying how to install it, where it is missing: a dashboard test that
// skips proves nothing.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed: the dashboard test drives it headless; install it with `apt-get install -y chromium` (.ci/run does)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1200),
		// Without these, chromium stalls on a machine with no internet.
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	return ctx
}

// waitJS waits until a JavaScript expression is true in the page.
func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(30*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector("main").innerText`))
		t.Fatalf("waiting for %s (%s): %v\npage:\n%s", what, expr, err, page)
	}
}

// The dashboard in a real browser: a request made during the test appears,
// moves to fulfilled and disappears; nodes show their provider, pool and
// label, pools their capacity; the last hour's launches and latency are
// drawn; a hold shows in the attention panel with its expiry in words.
func TestDashboardLive(t *testing.T) {
	t.Parallel()
	s := startSite(t, true)
	ready := s.readyNode("small")
	ctx := browser(t)
	if _, err := chromedp.Run(ctx, chromedp.Navigate(s.http.URL+"/dashboard/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the event stream", `document.getElementById("conn").dataset.state === "live"`)
	waitJS(t, ctx, "the ready node with its provider, pool and label",
		fmt.Sprintf(`!!document.querySelector('#nodes [data-node-id=%q][data-state="ready"][data-provider="cloud1"][data-pool="cloud1/main"][data-label="small"]')`, ready.ID))
	waitJS(t, ctx, "the pool's capacity against its max-servers",
		`/\b[1-9]\d* \/ 10 servers/.test(document.querySelector('#capacity [data-pool="cloud1/main"]')?.innerText)`)

	// Record every state the page shows for the request.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`
		window.seen = [];
		new MutationObserver(() => {
			const row = document.querySelector('[data-request-id="dash-1"]');
			const st = row ? row.dataset.state : "absent";
			if (window.seen[window.seen.length - 1] !== st) window.seen.push(st);
		}).observe(document.getElementById("requests"), {childList: true, subtree: true, attributes: true});
		true`)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.Submit(t.Context(), events.RequestMessage{ID: "dash-1", Labels: []string{"slow"}, Requestor: "dashboard-test"}); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the request waiting", `["requested", "pending"].includes(document.querySelector('[data-request-id="dash-1"]')?.dataset.state)`)
	waitJS(t, ctx, "the request fulfilled", `document.querySelector('[data-request-id="dash-1"]')?.dataset.state === "fulfilled"`)
	if err := s.client.DeleteRequest(t.Context(), "dash-1"); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the request gone", `!document.querySelector('[data-request-id="dash-1"]')`)
	seen, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.seen`))
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 3 || seen[len(seen)-2] != "fulfilled" || seen[len(seen)-1] != "absent" {
		t.Errorf("the page showed the request as %v; want it waiting, then fulfilled, then gone", seen)
	}
	// The last hour: the launches and the request's latency are drawn.
	waitJS(t, ctx, "the launches drawn", `document.querySelectorAll('#chart-launches rect.ok').length >= 1`)
	waitJS(t, ctx, "the request's latency drawn",
		`document.querySelectorAll('#chart-latency rect').length >= 1 && /median .*\(\d+ requests? fulfilled\)/.test(document.querySelector('#chart-latency figcaption').innerText)`)

	// A hold is visible at a glance.
	if _, err := s.client.HoldAny(t.Context(), ready.ID, "debugging the dashboard", time.Hour); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the held node in the attention panel",
		fmt.Sprintf(`document.querySelector('#attention [data-node-id=%q]')?.innerText.includes("debugging the dashboard")`, ready.ID))
	// Times in words: the hold expires in an hour (less the seconds the
	// test took), nowhere a raw RFC 3339 time.
	expires, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf(`document.querySelector('#attention [data-node-id=%q]').innerText`, ready.ID)))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`expires in (59m|1h)\b`).MatchString(expires) {
		t.Errorf("the hold's row says %q; want it to expire in 59m or 1h", expires)
	}
	noRawTimes(t, ctx)
	screenshot(t, ctx, "live")
}

// noRawTimes fails the test if the page shows a time as RFC 3339.
func noRawTimes(t *testing.T, ctx context.Context) {
	t.Helper()
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if raw := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d`).FindString(text); raw != "" {
		t.Errorf("the page shows a raw time (%s...):\n%s", raw, text)
	}
}

// screenshot saves what the window shows as a PNG in
// NODEPOOL_TEST_SCREENSHOTS, when set, to be looked at; scrolled to an
// element when a selector is given.
func screenshot(t *testing.T, ctx context.Context, name string, scrollTo ...string) {
	t.Helper()
	dir := os.Getenv("NODEPOOL_TEST_SCREENSHOTS")
	if dir == "" {
		return
	}
	for _, sel := range scrollTo {
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q).scrollIntoView(); true`, sel))); err != nil {
			t.Fatal(err)
		}
	}
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, t.Name()+"-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A provider whose launches keep failing is named at the top of the
// attention panel, with how many requests it failed in the last hour and
// the last reason; one that failed less often is not.
func TestDashboardShowsAFailingProvider(t *testing.T) {
	t.Parallel()
	s := startSiteWith(t, true, strings.Replace(siteConfig, "  - name: slow\n", "  - name: slow\n  - name: doomed\n", 1)+`
  - name: sick
    driver: fake
    failure-rate: 1
    launch-retries: 1
    pools:
      - name: main
        labels: [doomed]
`)
	ctx := browser(t)
	if _, err := chromedp.Run(ctx, chromedp.Navigate(s.http.URL+"/dashboard/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the event stream", `document.getElementById("conn").dataset.state === "live"`)
	for i := range 3 {
		id := fmt.Sprintf("doomed-%d", i)
		if _, err := s.client.Submit(t.Context(), events.RequestMessage{ID: id, Labels: []string{"doomed"}}); err != nil {
			t.Fatal(err)
		}
		s.waitFor(30*time.Second, id+" failed", func() bool {
			e, ok := s.reqs.Get(id)
			return ok && e.Value.State == kv.RequestFailed
		})
		if i < 2 {
			waitJS(t, ctx, id+" in the attention panel", fmt.Sprintf(`document.querySelector('#attention')?.innerText.includes("request %s")`, id))
			if shown, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!document.querySelector('[data-failing-provider]')`)); err != nil || shown {
				t.Fatalf("a failing provider shown after %d failed requests (%v)", i+1, err)
			}
		}
	}
	waitJS(t, ctx, "the failing provider", `document.querySelector('[data-failing-provider="sick"]')?.innerText.includes("3 requests and 3 launches failed in the last hour")`)
	waitJS(t, ctx, "the last reason", `document.querySelector('[data-failing-provider="sick"]')?.innerText.includes("launch failed after 1 attempt(s)")`)
	// It stands out in the capacity table too; a healthy provider does not.
	waitJS(t, ctx, "the failing provider marked in the capacity table",
		`document.querySelector('#capacity [data-capacity-provider="sick"]')?.classList.contains("failing") && !document.querySelector('#capacity [data-capacity-provider="cloud1"]').classList.contains("failing")`)
	waitJS(t, ctx, "the failures drawn", `document.querySelectorAll('#chart-failures rect.bad').length >= 1`)
	screenshot(t, ctx, "failing")
}

// The nodes of a provider no live process has any more show as
// draining; a removed provider whose drain cannot go on (here: no
// launcher ever recorded its configuration) is named in the attention
// panel with why, and how to give it up.
func TestDashboardShowsADrainingProvider(t *testing.T) {
	t.Parallel()
	s := startSite(t, true)
	ctx := browser(t)
	if _, err := chromedp.Run(ctx, chromedp.Navigate(s.http.URL+"/dashboard/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the event stream", `document.getElementById("conn").dataset.state === "live"`)
	now := time.Now().UTC()
	old := kv.Node{ID: "old-node-1", State: kv.NodeInUse, Labels: []string{"small"}, Provider: "old-cloud", Pool: "main",
		ExternalID: "i-old", Holder: "someone", Created: now, StateTime: now}
	if _, err := s.client.Buckets().Nodes.Create(t.Context(), old.ID, &old); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the removed provider's nodes marked draining",
		`!!document.querySelector('#nodes [data-node-id="old-node-1"][data-provider="old-cloud"][data-draining="true"]') && !!document.querySelector('#capacity [data-capacity-provider="old-cloud"][data-draining="true"]')`)
	if shown, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!document.querySelector('[data-provider="cloud1"][data-draining="true"], [data-capacity-provider="cloud1"][data-draining="true"]')`)); err != nil || shown {
		t.Errorf("a configured provider is shown draining (%v)", err)
	}
	waitJS(t, ctx, "the removed provider in the attention panel, stuck, with why",
		`(document.querySelector('#attention [data-draining-provider="old-cloud"][data-stuck="true"]')?.innerText || "").includes("no launcher recorded its configuration section")`)
	waitJS(t, ctx, "how to give it up", `document.querySelector('#attention [data-draining-provider="old-cloud"]').innerText.includes("nodepool erase old-cloud")`)
	screenshot(t, ctx, "draining")
}

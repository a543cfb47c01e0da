package web_test

import (
	"context"
	"fmt"
	"os/exec"
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
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()),
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
// moves to fulfilled and disappears; nodes are grouped by provider, pool
// and label; a hold shows in the attention panel.
func TestDashboardLive(t *testing.T) {
	t.Parallel()
	s := startSite(t, true)
	ready := s.readyNode("small")
	ctx := browser(t)
	if _, err := chromedp.Run(ctx, chromedp.Navigate(s.http.URL+"/dashboard/")); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the event stream", `document.getElementById("conn").dataset.state === "live"`)
	waitJS(t, ctx, "the ready node under its provider, pool and label",
		fmt.Sprintf(`!!document.querySelector('[data-provider="cloud1"] [data-pool="cloud1/main"] [data-label="small"] [data-node-id=%q][data-state="ready"]')`, ready.ID))

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

	// A hold is visible at a glance.
	if _, err := s.client.HoldAny(t.Context(), ready.ID, "debugging the dashboard", time.Hour); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, "the held node in the attention panel",
		fmt.Sprintf(`document.querySelector('#attention [data-node-id=%q]')?.innerText.includes("debugging the dashboard")`, ready.ID))
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
	waitJS(t, ctx, "the failing provider", `document.querySelector('[data-failing-provider="sick"]')?.innerText.includes("3 requests failed in the last hour")`)
	waitJS(t, ctx, "the last reason", `document.querySelector('[data-failing-provider="sick"]')?.innerText.includes("launch failed after 1 attempt(s)")`)
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
		`!!document.querySelector('[data-provider="old-cloud"][data-draining="true"] [data-node-id="old-node-1"]')`)
	if shown, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`!!document.querySelector('[data-provider="cloud1"][data-draining="true"]')`)); err != nil || shown {
		t.Errorf("a configured provider is shown draining (%v)", err)
	}
	waitJS(t, ctx, "the removed provider in the attention panel, stuck, with why",
		`(document.querySelector('#attention [data-draining-provider="old-cloud"][data-stuck="true"]')?.innerText || "").includes("no launcher recorded its configuration section")`)
	waitJS(t, ctx, "how to give it up", `document.querySelector('#attention [data-draining-provider="old-cloud"]').innerText.includes("nodepool erase old-cloud")`)
}

package status

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// A process that keeps watch caches of the records (any `nodepool run`
// with its status port) also serves the tables over NATS, so that
// `nodepool list` of 100,000 nodes need not read and decode every record
// again: it asks on RemoteSubject(table) with a Query, and the process,
// once its caches hold every change the buckets had when it was asked,
// answers with the table as the CLI would print it, in parts. The CLI
// reads the buckets itself when no process answers, when its credentials
// may not ask (a requestor's), or when told to (--from-buckets).

// RemotePrefix is the prefix of the subjects the tables are served on:
// nodepool.status.<table>.
const RemotePrefix = "nodepool.status."

// remoteQueue is the queue group of the serving processes: one answers.
const remoteQueue = "nodepool-status"

// Headers of the answer's parts.
const (
	// headerPart numbers a part of the answer from 1.
	headerPart = "Nodepool-Part"
	// headerParts is on the last part: how many parts hold the table.
	headerParts = "Nodepool-Parts"
	// headerError is on an answer that is an error, instead of parts.
	headerError = "Nodepool-Error"
	// headerBadQuery marks an error that is the query's (an unknown
	// field): the CLI reports it instead of reading the buckets.
	headerBadQuery = "Nodepool-Bad-Query"
)

// maxQuery bounds the size of a query a server reads.
const maxQuery = 16 << 10

// RemoteSubject is the subject a table is served on.
func RemoteSubject(table string) string { return RemotePrefix + table }

// Query is what the CLI asks of a serving process: the output it would
// print itself.
type Query struct {
	// Fields picks and orders the columns (none: the table's default, or
	// every column with Detail or JSON).
	Fields []string `json:"fields,omitempty"`
	// JSON asks for JSON objects instead of the text table.
	JSON bool `json:"json,omitempty"`
	// Detail shows every column of the text table.
	Detail bool `json:"detail,omitempty"`
}

// DecodeQuery reads a query as a server receives it: at most 16 KiB of
// one JSON object with the members above and no others.
func DecodeQuery(data []byte) (Query, error) {
	var q Query
	if len(data) > maxQuery {
		return q, fmt.Errorf("query of %d bytes; expected at most %d", len(data), maxQuery)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return q, nil
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(&q); err != nil {
		return Query{}, fmt.Errorf("query is not a JSON object with fields, json and detail: %w", err)
	}
	if d.More() {
		return Query{}, errors.New("query has data after its JSON object; expected one object")
	}
	for _, f := range q.Fields {
		if f == "" || len(f) > 64 {
			return Query{}, fmt.Errorf("query field %q; expected a column's name", f)
		}
	}
	return q, nil
}

// Write prints a table as the query asks: the one rendering the CLI and
// a serving process share.
func (q Query) Write(w io.Writer, t *Table) error {
	if _, err := t.Select(q.Fields); err != nil {
		return &BadQueryError{err}
	}
	if q.JSON {
		return t.WriteJSON(w, q.Fields)
	}
	fields := q.Fields
	if len(fields) == 0 && !q.Detail {
		fields = t.Default
	}
	return t.WriteText(w, fields)
}

// BadQueryError is a query the table cannot answer (an unknown field).
type BadQueryError struct{ Err error }

func (e *BadQueryError) Error() string { return "--fields: " + e.Err.Error() }
func (e *BadQueryError) Unwrap() error { return e.Err }

// SyncedSource is a Source whose records can be brought up to date with
// the buckets before a table is made of them.
type SyncedSource interface {
	Source
	// Sync waits until the source holds every change the buckets a
	// table reads had when it was called.
	Sync(ctx context.Context, table string) error
}

// ServeOptions configure Serve.
type ServeOptions struct {
	// Options complete the tables (the process's configuration); Now
	// is read on every query.
	Options func() Options
	// SyncTimeout bounds the wait for the caches (default 10 s).
	SyncTimeout time.Duration
	// Parallel bounds the tables made at once (default 2); a query
	// beyond it is answered busy, and the CLI reads the buckets itself.
	Parallel int
	Log      *slog.Logger
}

// Serve answers the tables' queries from src until stop is called (or the
// connection closes); once it returns, the server has the subscription.
func Serve(nc *nats.Conn, src SyncedSource, o ServeOptions) (stop func(), err error) {
	if o.SyncTimeout <= 0 {
		o.SyncTimeout = 10 * time.Second
	}
	if o.Parallel <= 0 {
		o.Parallel = 2
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	slots := make(chan struct{}, o.Parallel)
	sub, err := nc.QueueSubscribe(RemotePrefix+"*", remoteQueue, func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			answerError(nc, m.Reply, errors.New("busy: every table slot of this process is in use"), false)
			return
		}
		go func() {
			defer func() { <-slots }()
			serveQuery(ctx, nc, m, src, o)
		}()
	})
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		cancel()
		return nil, fmt.Errorf("serving the tables on %s*: %w", RemotePrefix, err)
	}
	return func() {
		_ = sub.Unsubscribe()
		cancel()
	}, nil
}

// serveQuery answers one query: the table in parts (`nats req
// nodepool.status.<table> '{}' --replies 0` prints them), or an error.
func serveQuery(ctx context.Context, nc *nats.Conn, m *nats.Msg, src SyncedSource, o ServeOptions) {
	table := strings.TrimPrefix(m.Subject, RemotePrefix)
	if !slices.Contains(Tables, table) {
		answerError(nc, m.Reply, &unknownTableError{table}, true)
		return
	}
	q, err := DecodeQuery(m.Data)
	if err != nil {
		answerError(nc, m.Reply, err, true)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, o.SyncTimeout)
	defer cancel()
	if err := src.Sync(sctx, table); err != nil {
		answerError(nc, m.Reply, fmt.Errorf("bringing the caches up to date: %w", err), false)
		return
	}
	opts := Options{}
	if o.Options != nil {
		opts = o.Options()
	}
	t, err := Load(sctx, src, table, opts)
	if err != nil {
		answerError(nc, m.Reply, err, false)
		return
	}
	pw := &partWriter{nc: nc, reply: m.Reply, size: partSize(nc)}
	if err := q.Write(pw, t); err != nil {
		var bad *BadQueryError
		answerError(nc, m.Reply, err, errors.As(err, &bad))
		return
	}
	if err := pw.close(); err != nil {
		o.Log.Warn("status table over NATS", "table", table, "err", err)
	}
}

// partSize is the data a part carries: the server's limit less room for
// the headers, at most 1 MiB.
func partSize(nc *nats.Conn) int {
	return int(min(max(nc.MaxPayload()-4096, 4096), 1<<20))
}

func answerError(nc *nats.Conn, reply string, err error, badQuery bool) {
	m := nats.NewMsg(reply)
	m.Header.Set(headerError, strings.NewReplacer("\r", " ", "\n", " ").Replace(err.Error()))
	if badQuery {
		m.Header.Set(headerBadQuery, "true")
	}
	_ = nc.PublishMsg(m)
}

// partWriter sends what is written to it as numbered parts.
type partWriter struct {
	nc    *nats.Conn
	reply string
	size  int
	buf   []byte
	n     int
	err   error
}

func (w *partWriter) Write(p []byte) (int, error) {
	written := len(p)
	for w.err == nil && len(w.buf)+len(p) > w.size {
		k := w.size - len(w.buf)
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		w.send(false)
	}
	w.buf = append(w.buf, p...)
	return written, w.err
}

func (w *partWriter) send(last bool) {
	w.n++
	m := nats.NewMsg(w.reply)
	m.Header.Set(headerPart, strconv.Itoa(w.n))
	if last {
		m.Header.Set(headerParts, strconv.Itoa(w.n))
	}
	m.Data = w.buf
	if err := w.nc.PublishMsg(m); err != nil && w.err == nil {
		w.err = err
	}
	w.buf = nil
}

func (w *partWriter) close() error {
	if w.err != nil {
		return w.err
	}
	w.send(true)
	return w.err
}

// ErrNoServer says no process served the table: the caller reads the
// buckets itself.
var ErrNoServer = errors.New("no nodepool process serves the tables")

// Fetch asks a serving process for a table as q prints it and writes it
// to w once every part arrived (nothing is written otherwise). It returns
// an error wrapping ErrNoServer when no process serves the tables, when
// this connection may not ask, when the first part does not come within
// firstWait, or when a process could not answer (busy, caches not in
// time): the caller then reads the buckets; and a *BadQueryError when the
// query is wrong.
func Fetch(ctx context.Context, nc *nats.Conn, table string, q Query, firstWait time.Duration, w io.Writer) error {
	data, err := json.Marshal(q)
	if err != nil {
		return err
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// An answer of a hundred parts must not be cut by the subscription's
	// pending limits.
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.PublishRequest(RemoteSubject(table), inbox, data); err != nil {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	fctx, cancel := context.WithTimeout(ctx, firstWait)
	err = nc.FlushWithContext(fctx)
	cancel()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	// A publish these credentials may not make is refused by the server
	// before it answers the flush.
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), RemotePrefix) {
		return fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	return readParts(ctx, sub, firstWait, w)
}

// partWait bounds the wait for each part after the first (sent one after
// the other, once the table is made).
const partWait = 30 * time.Second

// readParts reads the parts of an answer.
func readParts(ctx context.Context, sub *nats.Subscription, firstWait time.Duration, w io.Writer) error {
	var parts [][]byte
	wait := firstWait
	for {
		wctx, cancel := context.WithTimeout(ctx, wait)
		m, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, nats.ErrNoResponders) {
				return fmt.Errorf("%w: %w", ErrNoServer, err)
			}
			return fmt.Errorf("%w: no answer within %s: %w", ErrNoServer, wait, err)
		}
		wait = partWait
		if m.Header.Get("Status") == "503" {
			return fmt.Errorf("%w: %w", ErrNoServer, nats.ErrNoResponders)
		}
		if e := m.Header.Get(headerError); e != "" {
			if m.Header.Get(headerBadQuery) == "true" {
				return &BadQueryError{errors.New(strings.TrimPrefix(e, "--fields: "))}
			}
			return fmt.Errorf("%w: the serving process: %s", ErrNoServer, e)
		}
		n, err := strconv.Atoi(m.Header.Get(headerPart))
		if err != nil || n != len(parts)+1 {
			return fmt.Errorf("%w: part %q out of order after %d parts", ErrNoServer, m.Header.Get(headerPart), len(parts))
		}
		parts = append(parts, m.Data)
		if total := m.Header.Get(headerParts); total != "" {
			if total != strconv.Itoa(len(parts)) {
				return fmt.Errorf("%w: %s parts announced, %d received", ErrNoServer, total, len(parts))
			}
			for _, p := range parts {
				if _, err := w.Write(p); err != nil {
					return err
				}
			}
			return nil
		}
	}
}

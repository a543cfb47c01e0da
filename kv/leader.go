package kv

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/nodepool-nats/nodepool/internal/natsretry"
)

// A KV Get is a JetStream direct get, which any replica of a replicated
// bucket may answer, and a replica that is catching up (a server just
// restarted) answers with an older revision of a record, or none. A
// revision-checked update made from it only fails, but a decision taken on
// the old record is wrong: a requestor told that its request is fulfilled
// reads its node as still building and gives up on it; a launcher reads a
// used node as still in use and drops the change that asked for its
// deletion. The stream's leader answers only with what it committed, so
// Get is sent to it when the bucket has more than one replica.

// leaderKV is a bucket whose Get reads from its stream's leader.
type leaderKV struct {
	jetstream.KeyValue
	nc      *nats.Conn
	subject string // the stream's message get API
	prefix  string // $KV.<bucket>.
}

// ReadFromLeader returns the bucket itself when it has one replica, and
// otherwise the bucket with its Get sent to the leader of its stream.
func ReadFromLeader(ctx context.Context, js jetstream.JetStream, b jetstream.KeyValue) (jetstream.KeyValue, error) {
	st, err := natsretry.Do(ctx, func(ctx context.Context) (jetstream.KeyValueStatus, error) { return b.Status(ctx) })
	if err != nil {
		return nil, fmt.Errorf("reading the status of bucket %s: %w", b.Bucket(), err)
	}
	bst, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return b, nil
	}
	return readFromLeader(js, b, bst.StreamInfo().Config), nil
}

// readFromLeader is ReadFromLeader for a bucket whose stream's
// configuration is known.
func readFromLeader(js jetstream.JetStream, b jetstream.KeyValue, sc jetstream.StreamConfig) jetstream.KeyValue {
	if sc.Replicas <= 1 {
		return b
	}
	return &leaderKV{KeyValue: b, nc: js.Conn(),
		subject: "$JS.API.STREAM.MSG.GET." + sc.Name,
		prefix:  "$KV." + b.Bucket() + "."}
}

// Get reads the newest value of a key from the stream leader.
func (l *leaderKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	m, err := l.getMsg(ctx, map[string]any{"last_by_subj": l.prefix + key})
	switch {
	case err != nil:
		return nil, fmt.Errorf("reading %s/%s from the stream leader: %w", l.Bucket(), key, err)
	case m == nil:
		return nil, jetstream.ErrKeyNotFound
	}
	e := &leaderEntry{bucket: l.Bucket(), key: key, value: m.Data, revision: m.Seq, created: m.Time, op: jetstream.KeyValuePut}
	if len(m.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(m.Header)
		if err != nil {
			return nil, fmt.Errorf("reading %s/%s from the stream leader: %w", l.Bucket(), key, err)
		}
		switch {
		case h.Get("KV-Operation") == "DEL":
			e.op = jetstream.KeyValueDelete
		case h.Get("KV-Operation") == "PURGE":
			e.op = jetstream.KeyValuePurge
		case h.Get(jetstream.MarkerReasonHeader) != "":
			e.op = jetstream.KeyValuePurge
		}
	}
	if e.op != jetstream.KeyValuePut {
		return nil, jetstream.ErrKeyNotFound // as the bucket's own Get says
	}
	return e, nil
}

// leaderEntry is a record read from the stream leader.
type leaderEntry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
	op          jetstream.KeyValueOp
}

func (e *leaderEntry) Bucket() string                  { return e.bucket }
func (e *leaderEntry) Key() string                     { return e.key }
func (e *leaderEntry) Value() []byte                   { return e.value }
func (e *leaderEntry) Revision() uint64                { return e.revision }
func (e *leaderEntry) Created() time.Time              { return e.created }
func (e *leaderEntry) Delta() uint64                   { return 0 }
func (e *leaderEntry) Operation() jetstream.KeyValueOp { return e.op }

// nextAfter asks the stream's leader for the sequence of the first message
// after seq whose subject matches the bucket's key pattern keys (all keys
// if empty); found is false if there is none.
func (l *leaderKV) nextAfter(ctx context.Context, seq uint64, keys string) (next uint64, found bool, err error) {
	m, err := l.getMsg(ctx, map[string]any{"seq": seq + 1, "next_by_subj": l.prefix + cmp.Or(keys, ">")})
	switch {
	case err != nil:
		return 0, false, fmt.Errorf("reading the message of %s after %d from the stream leader: %w", l.Bucket(), seq, err)
	case m == nil:
		return 0, false, nil
	}
	return m.Seq, true, nil
}

// leaderMsg is a message of the stream as its leader gives it.
type leaderMsg struct {
	Seq    uint64    `json:"seq"`
	Header []byte    `json:"hdrs"`
	Data   []byte    `json:"data"`
	Time   time.Time `json:"time"`
}

// getMsg asks the stream's leader for the message req names (the stream
// message get API's request); nil if there is none.
func (l *leaderKV) getMsg(ctx context.Context, req map[string]any) (*leaderMsg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
	}
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	msg, err := l.nc.RequestWithContext(ctx, l.subject, data)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *leaderMsg          `json:"message"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, err
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, nil
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, errors.New("an answer without a message")
	}
	return resp.Message, nil
}

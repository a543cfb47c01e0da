package awsbody

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// conn stands for the connection under net/http's buffered writer. It
// takes the body as the transport's connection does (ReadFrom, once the
// headers went out); when the last byte is in, the server has the
// request, the response comes back and the SDK closes the request's body,
// all before net/http's writer goes on.
type conn struct {
	body io.Closer
	got  bytes.Buffer
}

func (c *conn) Write(p []byte) (int, error) { return c.got.Write(p) }

func (c *conn) ReadFrom(r io.Reader) (int64, error) {
	n, err := c.got.ReadFrom(r)
	_ = c.body.Close()
	return n, err
}

// sdkRequest builds an http.Request the way the SDK does for a Query
// call: a form body behind smithy-go's closable wrapper.
const form = "Action=DescribeInstances&Version=2016-11-15"

func sdkRequest(t *testing.T) *http.Request {
	t.Helper()
	sr := smithyhttp.NewStackRequest().(*smithyhttp.Request)
	sr.Method = http.MethodPost
	sr.URL.Scheme, sr.URL.Host, sr.URL.Path = "http", "127.0.0.1", "/"
	sr.ContentLength = int64(len(form))
	s, err := sr.SetStream(strings.NewReader(form))
	if err != nil {
		t.Fatal(err)
	}
	return s.Build(t.Context())
}

// TestBodyClosedUnderTheWriter writes a request with net/http's own
// writer while the SDK closes its body after the last byte went out, as
// happens when the response is quick. Bare, the SDK's body fails the
// write (the transport then closes the connection under the response);
// wrapped, the write ends cleanly.
func TestBodyClosedUnderTheWriter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		wrap    bool
		wantErr bool
	}{
		{"the SDK's body", false, true},
		{"wrapped", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req := sdkRequest(t)
			if _, ok := req.Body.(io.WriterTo); !ok {
				t.Fatalf("the SDK's request body (%T) is no longer an io.WriterTo: this work-around may be moot", req.Body)
			}
			var body io.Closer = req.Body
			if tc.wrap {
				var got *http.Request
				_, _ = Client(doFunc(func(r *http.Request) (*http.Response, error) {
					got = r
					return nil, errors.New("not sent")
				})).Do(req)
				req = got
				if _, ok := req.Body.(io.WriterTo); ok {
					t.Fatal("the wrapped body still offers WriteTo")
				}
			}
			c := &conn{body: body}
			w := bufio.NewWriter(c)
			err := req.Write(w)
			if err == nil {
				err = w.Flush()
			}
			if gotErr := err != nil; gotErr != tc.wantErr {
				t.Fatalf("writing the request: %v (want an error: %v)", err, tc.wantErr)
			}
			if tc.wantErr && !errors.Is(err, io.EOF) {
				t.Fatalf("the SDK's body failed the write with %v, want io.EOF", err)
			}
			if !strings.HasSuffix(c.got.String(), "\r\n\r\n"+form) {
				t.Fatalf("the connection got %q, want the request ending with its form", c.got.String())
			}
		})
	}
}

type doFunc func(*http.Request) (*http.Response, error)

func (f doFunc) Do(r *http.Request) (*http.Response, error) { return f(r) }

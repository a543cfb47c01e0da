// Package awsbody works around a race between the AWS SDK and net/http
// that closes a connection under a response being read.
//
// The SDK (smithy-go) wraps a request's body in a reader that answers
// io.EOF once closed, and closes it as soon as the response's headers are
// in. net/http's writer may still be busy with the request at that
// instant: after copying Content-Length bytes it reads the body once more
// to check that nothing is left, and when the body is an io.WriterTo it
// does so through WriteTo. The SDK's WriteTo of a closed body returns
// io.EOF as an error (a WriteTo must return nil at the end), the
// transport takes it for a failed write and closes the connection, and
// the reader of the response gets "use of closed network connection"
// with status 200 (aws/aws-sdk-go-v2#1825, #2737; smithy-go v1.28.9
// still does this).
//
// The server has the whole request by then, so the call took effect: a
// retry is no cure for a call that is not idempotent. Hiding WriteTo
// makes net/http read the body with Read, whose io.EOF after the close
// is the normal end of a copy.
package awsbody

import (
	"io"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
)

// Client wraps an SDK HTTP client (nil: the SDK's default one) so that
// the request bodies it sends show net/http only Read and Close.
func Client(c aws.HTTPClient) aws.HTTPClient {
	if c == nil {
		c = awshttp.NewBuildableClient()
	}
	return client{c}
}

type client struct{ aws.HTTPClient }

func (c client) Do(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = readCloser{r.Body}
	}
	return c.HTTPClient.Do(r)
}

// readCloser shows only Read and Close of the body it wraps.
type readCloser struct{ rc io.ReadCloser }

func (b readCloser) Read(p []byte) (int, error) { return b.rc.Read(p) }
func (b readCloser) Close() error               { return b.rc.Close() }

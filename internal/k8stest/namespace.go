package k8stest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var notDNS = regexp.MustCompile(`[^a-z0-9]+`)

// Namespace creates a namespace of the test's own, named after the test,
// and waits for its default ServiceAccount (pods cannot be created
// before it is there); the namespace is deleted when the test ends,
// without waiting for it to be gone.
func (s *Stack) Namespace(t testing.TB) string {
	t.Helper()
	base := strings.Trim(notDNS.ReplaceAllString(strings.ToLower(t.Name()), "-"), "-")
	if len(base) > 48 {
		base = strings.TrimRight(base[:48], "-")
	}
	name := fmt.Sprintf("%s-%d", base, s.nsSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"k8stest": "true"}}}
	if _, err := s.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", name, err)
		}
	})
	if err := s.waitFor(ctx, "the default ServiceAccount of "+name, 60*time.Second, func(ctx context.Context) (bool, error) {
		return exists(s.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{}))
	}); err != nil {
		t.Fatal(err)
	}
	return name
}

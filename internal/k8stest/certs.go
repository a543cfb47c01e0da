package k8stest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// files are the credentials a stack's processes read, all under its
// directory.
type files struct {
	ca, cert, key string // the API server's CA and serving certificate
	saKey, saPub  string // the service accounts' signing key
	tokens        string // the static token file: the admin's token
	kubeconfig    string // the admin's kubeconfig
	stages        string // kwok's stages
	caPEM         []byte
	adminToken    string
}

// writeFiles makes a CA and a serving certificate for 127.0.0.1 and the
// in-cluster names, a service-account signing key, a random admin token
// and the files that hold them.
func writeFiles(dir, server string) (*files, error) {
	f := &files{
		ca: filepath.Join(dir, "ca.crt"), cert: filepath.Join(dir, "apiserver.crt"), key: filepath.Join(dir, "apiserver.key"),
		saKey: filepath.Join(dir, "sa.key"), saPub: filepath.Join(dir, "sa.pub"),
		tokens: filepath.Join(dir, "tokens.csv"), kubeconfig: filepath.Join(dir, "admin.kubeconfig"),
		stages: filepath.Join(dir, "kwok-stages.yaml"),
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "k8stest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(serviceIP)},
		NotBefore:   now.Add(-time.Hour), NotAfter: now.Add(7 * 24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	// Service-account tokens are signed with RSA, as most clusters do.
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return nil, err
	}
	f.adminToken = hex.EncodeToString(tok)
	f.caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: k8stest
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: k8stest
  context:
    cluster: k8stest
    user: admin
    namespace: default
current-context: k8stest
`, server, f.ca, f.adminToken)
	for name, data := range map[string][]byte{
		f.ca:         f.caPEM,
		f.cert:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		f.key:        pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		f.saKey:      pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		f.saPub:      pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		f.tokens:     fmt.Appendf(nil, "%s,admin,admin-uid,\"system:masters\"\n", f.adminToken),
		f.kubeconfig: []byte(kubeconfig),
		f.stages:     stages,
	} {
		if err := os.WriteFile(name, data, 0o600); err != nil {
			return nil, err
		}
	}
	return f, nil
}

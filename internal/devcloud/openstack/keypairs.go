package openstack

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
)

var keypairNameRE = regexp.MustCompile(`^[a-zA-Z0-9 _.@-]{1,255}$`)

func (c *Cloud) keypairJSON(r *http.Request, k *keypair, detail bool) map[string]any {
	out := map[string]any{"name": k.name, "public_key": k.publicKey, "fingerprint": k.fingerprint}
	if mv(r) >= 2 {
		out["type"] = k.typ
	}
	if detail {
		out["user_id"], out["created_at"], out["deleted"], out["updated_at"], out["id"] = c.st.userID, stampMicro(k.created), false, nil, 1
	}
	return out
}

func (c *Cloud) listKeypairs(w http.ResponseWriter, r *http.Request, _ time.Time) {
	names := make([]string, 0, len(c.st.keypairs))
	for n := range c.st.keypairs {
		names = append(names, n)
	}
	slices.Sort(names)
	out := []any{}
	for _, n := range names {
		out = append(out, map[string]any{"keypair": c.keypairJSON(r, c.st.keypairs[n], false)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"keypairs": out})
}

func (c *Cloud) createKeypair(w http.ResponseWriter, r *http.Request, now time.Time) {
	var body struct {
		Keypair struct {
			Name      string `json:"name"`
			PublicKey string `json:"public_key"`
			Type      string `json:"type"`
		} `json:"keypair"`
	}
	if err := readJSON(r, &body); err != nil {
		novaError(w, http.StatusBadRequest, "Invalid JSON in request body: "+err.Error())
		return
	}
	kp := body.Keypair
	if !keypairNameRE.MatchString(kp.Name) {
		novaError(w, http.StatusBadRequest, "Keypair data is invalid: Keypair name contains unsafe characters")
		return
	}
	if _, dup := c.st.keypairs[kp.Name]; dup {
		novaError(w, http.StatusConflict, fmt.Sprintf("Key pair '%s' already exists.", kp.Name))
		return
	}
	if kp.Type == "" {
		kp.Type = "ssh"
	}
	private := ""
	if strings.TrimSpace(kp.PublicKey) == "" {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			novaError(w, http.StatusInternalServerError, err.Error())
			return
		}
		sshPub, _ := ssh.NewPublicKey(pub)
		block, err := ssh.MarshalPrivateKey(priv, kp.Name)
		if err != nil {
			novaError(w, http.StatusInternalServerError, err.Error())
			return
		}
		kp.PublicKey = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))) + " Generated-by-Nova"
		private = string(pem.EncodeToMemory(block))
	}
	key, _, _, _, err := ssh.ParseAuthorizedKey([]byte(kp.PublicKey))
	if err != nil {
		novaError(w, http.StatusBadRequest, "Keypair data is invalid: failed to generate fingerprint")
		return
	}
	k := &keypair{name: kp.Name, publicKey: kp.PublicKey, fingerprint: ssh.FingerprintLegacyMD5(key), typ: kp.Type, created: now}
	c.st.keypairs[k.name] = k
	out := c.keypairJSON(r, k, false)
	out["user_id"] = c.st.userID
	if private != "" {
		out["private_key"] = private
	}
	status := http.StatusOK
	if mv(r) >= 2 {
		status = http.StatusCreated
	}
	writeJSON(w, status, map[string]any{"keypair": out})
}

func (c *Cloud) keypairItem(w http.ResponseWriter, r *http.Request, _ time.Time) {
	k, ok := c.st.keypairs[r.PathValue("name")]
	if !ok {
		novaError(w, http.StatusNotFound, fmt.Sprintf("Keypair %s not found for user %s", r.PathValue("name"), c.st.userID))
		return
	}
	if r.Method == http.MethodDelete {
		delete(c.st.keypairs, k.name)
		if mv(r) >= 2 {
			w.WriteHeader(http.StatusNoContent)
		} else {
			w.WriteHeader(http.StatusAccepted)
		}
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"keypair": c.keypairJSON(r, k, true)})
}

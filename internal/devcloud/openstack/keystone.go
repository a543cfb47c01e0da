package openstack

import (
	"net/http"
	"time"
)

// routes registers every service's handlers.
func (c *Cloud) routes() {
	c.mux = http.NewServeMux()
	c.identityRoutes()
	c.computeRoutes()
	c.imageRoutes()
	c.networkRoutes()
	c.volumeRoutes()
	c.quotaRoutes()
}

func (c *Cloud) identityRoutes() {
	m := c.mux
	m.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusMultipleChoices, map[string]any{"versions": map[string]any{"values": []any{identityVersion(r)}}})
	})
	m.HandleFunc("GET /v3", c.identityVersionDoc)
	m.HandleFunc("GET /v3/{$}", c.identityVersionDoc)
	m.HandleFunc("POST /v3/auth/tokens", c.locked(c.createToken))
	m.HandleFunc("GET /v3/auth/tokens", c.locked(c.validateToken))
	m.HandleFunc("HEAD /v3/auth/tokens", c.locked(c.validateToken))
	m.HandleFunc("DELETE /v3/auth/tokens", c.locked(c.revokeToken))
	m.HandleFunc("GET /v3/auth/catalog", c.locked(func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		writeJSON(w, http.StatusOK, map[string]any{"catalog": c.catalog(r), "links": map[string]any{"self": base(r) + "/identity/v3/auth/catalog"}})
	}))
	m.HandleFunc("GET /v3/auth/projects", c.locked(func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		writeJSON(w, http.StatusOK, map[string]any{"projects": []any{c.projectJSON(r)}, "links": map[string]any{"self": base(r) + "/identity/v3/auth/projects"}})
	}))
	m.HandleFunc("GET /v3/projects/{id}", c.locked(func(w http.ResponseWriter, r *http.Request, _ time.Time) {
		if r.PathValue("id") != c.st.projectID {
			keystoneError(w, http.StatusNotFound, "Not Found", "Could not find project: "+r.PathValue("id")+".")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"project": c.projectJSON(r)})
	}))
}

func identityVersion(r *http.Request) map[string]any {
	return map[string]any{
		"id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
		"links":       []any{map[string]any{"rel": "self", "href": base(r) + "/identity/v3/"}},
		"media-types": []any{map[string]any{"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}},
	}
}

func (c *Cloud) identityVersionDoc(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"version": identityVersion(r)})
}

// authRequest is the body of POST /v3/auth/tokens.
type authRequest struct {
	Auth struct {
		Identity struct {
			Methods  []string `json:"methods"`
			Password *struct {
				User struct {
					ID       string `json:"id"`
					Name     string `json:"name"`
					Password string `json:"password"`
					Domain   *struct {
						ID   string `json:"id"`
						Name string `json:"name"`
					} `json:"domain"`
				} `json:"user"`
			} `json:"password"`
			ApplicationCredential *struct {
				ID     string `json:"id"`
				Name   string `json:"name"`
				Secret string `json:"secret"`
			} `json:"application_credential"`
			Token *struct {
				ID string `json:"id"`
			} `json:"token"`
		} `json:"identity"`
		Scope *struct {
			Project *struct {
				ID     string `json:"id"`
				Name   string `json:"name"`
				Domain *struct {
					ID   string `json:"id"`
					Name string `json:"name"`
				} `json:"domain"`
			} `json:"project"`
		} `json:"scope"`
	} `json:"auth"`
}

func (c *Cloud) createToken(w http.ResponseWriter, r *http.Request, now time.Time) {
	var req authRequest
	if err := readJSON(r, &req); err != nil {
		keystoneError(w, http.StatusBadRequest, "Bad Request", err.Error())
		return
	}
	id := req.Auth.Identity
	unauthorized := func() {
		keystoneError(w, http.StatusUnauthorized, "Unauthorized", "The request you have made requires authentication.")
	}
	if len(id.Methods) == 0 {
		keystoneError(w, http.StatusBadRequest, "Bad Request", "Invalid input for field 'identity': 'methods' is a required property")
		return
	}
	appCred := ""
	switch id.Methods[0] {
	case "password":
		p := id.Password
		if p == nil || p.User.Password != c.opts.Password || (p.User.Name != c.opts.User && p.User.ID != c.st.userID) {
			unauthorized()
			return
		}
		if p.User.ID == "" && p.User.Domain == nil {
			keystoneError(w, http.StatusBadRequest, "Bad Request", "Expecting to find domain in user. The server could not comply with the request since it is either malformed or otherwise incorrect. The client is assumed to be in error.")
			return
		}
	case "application_credential":
		a := id.ApplicationCredential
		if a == nil || c.opts.AppCredentialID == "" || a.Secret != c.opts.AppCredentialSecret || (a.ID != c.opts.AppCredentialID && a.Name != c.opts.AppCredentialID) {
			unauthorized()
			return
		}
		appCred = c.opts.AppCredentialID
	case "token":
		t := id.Token
		if t == nil {
			unauthorized()
			return
		}
		old, ok := c.st.tokens[t.ID]
		if !ok || now.After(old.expires) {
			unauthorized()
			return
		}
		appCred = old.appCred
	default:
		keystoneError(w, http.StatusUnauthorized, "Unauthorized", "Attempted to authenticate with an unsupported method.")
		return
	}
	if s := req.Auth.Scope; s != nil && s.Project != nil && s.Project.ID != c.st.projectID && s.Project.Name != c.opts.Project {
		keystoneError(w, http.StatusUnauthorized, "Unauthorized", "The request you have made requires authentication.")
		return
	}
	t := &token{id: "gAAAAA" + randomHex(40), methods: id.Methods[:1], issued: now, expires: now.Add(c.opts.TokenTTL),
		appCred: appCred, auditIDs: []string{randomHex(11)}}
	c.st.tokens[t.id] = t
	w.Header().Set("X-Subject-Token", t.id)
	writeJSON(w, http.StatusCreated, map[string]any{"token": c.tokenJSON(r, t)})
}

func (c *Cloud) validateToken(w http.ResponseWriter, r *http.Request, now time.Time) {
	t, ok := c.st.tokens[r.Header.Get("X-Subject-Token")]
	if !ok || now.After(t.expires) {
		keystoneError(w, http.StatusNotFound, "Not Found", "Could not find token: "+r.Header.Get("X-Subject-Token")+".")
		return
	}
	w.Header().Set("X-Subject-Token", t.id)
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"token": c.tokenJSON(r, t)})
}

func (c *Cloud) revokeToken(w http.ResponseWriter, r *http.Request, _ time.Time) {
	id := r.Header.Get("X-Subject-Token")
	if _, ok := c.st.tokens[id]; !ok {
		keystoneError(w, http.StatusNotFound, "Not Found", "Could not find token: "+id+".")
		return
	}
	delete(c.st.tokens, id)
	w.WriteHeader(http.StatusNoContent)
}

func (c *Cloud) domainJSON() map[string]any {
	return map[string]any{"id": c.st.domainID, "name": DefaultDomain}
}

func (c *Cloud) projectJSON(r *http.Request) map[string]any {
	return map[string]any{"id": c.st.projectID, "name": c.opts.Project, "domain_id": c.st.domainID,
		"enabled": true, "is_domain": false, "parent_id": c.st.domainID, "description": "", "tags": []any{},
		"links": map[string]any{"self": base(r) + "/identity/v3/projects/" + c.st.projectID}}
}

func (c *Cloud) tokenJSON(r *http.Request, t *token) map[string]any {
	out := map[string]any{
		"methods":    t.methods,
		"user":       map[string]any{"id": c.st.userID, "name": c.opts.User, "domain": c.domainJSON(), "password_expires_at": nil},
		"audit_ids":  t.auditIDs,
		"issued_at":  t.issued.Format("2006-01-02T15:04:05.000000Z"),
		"expires_at": t.expires.Format("2006-01-02T15:04:05.000000Z"),
		"project":    map[string]any{"id": c.st.projectID, "name": c.opts.Project, "domain": c.domainJSON()},
		"is_domain":  false,
		"roles": []any{
			map[string]any{"id": idFrom("role", "member"), "name": "member"},
			map[string]any{"id": idFrom("role", "reader"), "name": "reader"},
		},
		"catalog": c.catalog(r),
	}
	if t.appCred != "" {
		out["application_credential"] = map[string]any{"id": t.appCred, "name": t.appCred, "restricted": true}
	}
	return out
}

// catalog lists the services with their endpoints, as DevStack lays them
// out under one host.
func (c *Cloud) catalog(r *http.Request) []any {
	b := base(r)
	entry := func(typ, name, url string) map[string]any {
		var eps []any
		for _, iface := range []string{"public", "internal", "admin"} {
			eps = append(eps, map[string]any{"id": idFrom("endpoint", typ+iface), "interface": iface,
				"region_id": c.opts.Region, "region": c.opts.Region, "url": url})
		}
		return map[string]any{"id": idFrom("service", typ), "type": typ, "name": name, "endpoints": eps}
	}
	project := c.st.projectID
	return []any{
		entry("identity", "keystone", b+"/identity"),
		entry("compute", "nova", b+"/compute/v2.1"),
		entry("image", "glance", b+"/image"),
		entry("network", "neutron", b+"/network"),
		entry("block-storage", "cinder", b+"/volume/v3/"+project),
		entry("volumev3", "cinderv3", b+"/volume/v3/"+project),
	}
}

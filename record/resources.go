package record

import (
	"encoding/json"
	"fmt"
	"maps"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Resources is what a node counts against quota: cores, RAM (MB) and
// instances, and Other resources by name that some clouds count (AWS
// counts vCPUs per instance family, by quota code such as L-1216C47A). In
// records the other resources are keys of `resources` beside cores, ram
// and instances, as in Nodepool.
type Resources struct {
	Cores     int
	RAM       int
	Instances int
	// Other never aliases another Resources' map: Add, Sub and Less
	// return fresh maps.
	Other map[string]int
}

// Add returns r + o.
func (r Resources) Add(o Resources) Resources {
	out := Resources{Cores: r.Cores + o.Cores, RAM: r.RAM + o.RAM, Instances: r.Instances + o.Instances}
	if len(r.Other)+len(o.Other) > 0 {
		out.Other = maps.Clone(r.Other)
		if out.Other == nil {
			out.Other = map[string]int{}
		}
		for k, v := range o.Other {
			out.Other[k] += v
		}
	}
	return out
}

// Sub returns r - o.
func (r Resources) Sub(o Resources) Resources {
	neg := Resources{Cores: -o.Cores, RAM: -o.RAM, Instances: -o.Instances}
	if len(o.Other) > 0 {
		neg.Other = make(map[string]int, len(o.Other))
		for k, v := range o.Other {
			neg.Other[k] = -v
		}
	}
	return r.Add(neg)
}

// Less is what is left of a limit r once o is taken: r - o for cores, RAM
// and instances, and for the other resources r limits; a resource r does
// not name is not limited, and stays so.
func (r Resources) Less(o Resources) Resources {
	out := Resources{Cores: r.Cores - o.Cores, RAM: r.RAM - o.RAM, Instances: r.Instances - o.Instances}
	if r.Other != nil {
		out.Other = maps.Clone(r.Other)
		for k := range out.Other {
			out.Other[k] -= o.Other[k]
		}
	}
	return out
}

// Clone returns a copy that shares nothing with r.
func (r Resources) Clone() Resources {
	r.Other = maps.Clone(r.Other)
	return r
}

var fixedResources = map[string]bool{"cores": true, "ram": true, "instances": true}

// MarshalJSON writes cores, ram, instances and the other resources as keys
// of one object.
func (r Resources) MarshalJSON() ([]byte, error) {
	m := make(map[string]int, 3+len(r.Other))
	for k, v := range r.Other {
		if !fixedResources[k] {
			m[k] = v
		}
	}
	m["cores"], m["ram"], m["instances"] = r.Cores, r.RAM, r.Instances
	return json.Marshal(m)
}

// UnmarshalJSON reads what MarshalJSON writes; every value must be an
// integer.
func (r *Resources) UnmarshalJSON(b []byte) error { return Unmarshal(b, r) }

// resourcesJSON is Resources as its records hold it: the members that are
// not cores, ram or instances are the other resources.
type resourcesJSON struct {
	Cores     int            `json:"cores"`
	RAM       int            `json:"ram"`
	Instances int            `json:"instances"`
	Other     map[string]int `json:",inline"`
}

// UnmarshalJSONFrom is UnmarshalJSON for Unmarshal, which decodes a node's
// resources in place (without reading them into a map first).
func (r *Resources) UnmarshalJSONFrom(dec *jsontext.Decoder) error {
	var v resourcesJSON
	if err := jsonv2.UnmarshalDecode(dec, &v); err != nil {
		return fmt.Errorf("resources: expected an object of integers: %w", err)
	}
	*r = Resources(v)
	return nil
}

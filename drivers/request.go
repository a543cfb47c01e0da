package drivers

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Field is a field of the request as Nodepool's {request.FIELD} format
// strings give it (dynamic-instance-properties, dynamic-labels), for
// config.ExpandRequestTemplate: id, labels (a Python list), requestor,
// requestor_data (JSON, or the value of key), relative_priority,
// event_id, created_time (Unix seconds), tenant_name. ok is false for a
// field it does not know and a requestor_data key the request lacks; a
// node launched for no request has empty fields.
func (r *RequestInfo) Field(field, key string) (value string, ok bool) {
	if r == nil {
		return "", true
	}
	switch field {
	case "id":
		return r.ID, true
	case "labels":
		quoted := make([]string, len(r.Labels))
		for i, l := range r.Labels {
			quoted[i] = "'" + l + "'"
		}
		return "[" + strings.Join(quoted, ", ") + "]", true
	case "requestor":
		return r.Requestor, true
	case "requestor_data":
		if key != "" {
			v, ok := r.RequestorData[key]
			return v, ok
		}
		data, _ := json.Marshal(r.RequestorData)
		return string(data), true
	case "relative_priority":
		return strconv.Itoa(r.RelativePriority), true
	case "event_id":
		return r.EventID, true
	case "created_time":
		return strconv.FormatFloat(float64(r.Created.UnixNano())/1e9, 'f', 6, 64), true
	case "tenant_name":
		return r.Tenant, true
	}
	return "", false
}

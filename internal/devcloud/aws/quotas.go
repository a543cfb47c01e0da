package aws

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/nodepool-nats/nodepool/internal/awsquota"
)

// Service Quotas speaks JSON 1.1: POST / with X-Amz-Target
// "ServiceQuotasV20190624.<Operation>" and a JSON body; errors are a JSON
// body with "__type" and "message" and the X-Amzn-ErrorType header.

const quotasTargetPrefix = "ServiceQuotasV20190624."

type sqQuota struct {
	ServiceCode         string         `json:"ServiceCode"`
	ServiceName         string         `json:"ServiceName"`
	QuotaArn            string         `json:"QuotaArn"`
	QuotaCode           string         `json:"QuotaCode"`
	QuotaName           string         `json:"QuotaName"`
	Value               float64        `json:"Value"`
	Unit                string         `json:"Unit"`
	Adjustable          bool           `json:"Adjustable"`
	GlobalQuota         bool           `json:"GlobalQuota"`
	QuotaAppliedAtLevel string         `json:"QuotaAppliedAtLevel"`
	UsageMetric         map[string]any `json:"UsageMetric,omitempty"`
}

// quotaServices are the services whose quotas the cloud serves, by code.
var quotaServices = map[string]string{
	awsquota.ServiceCode:    "Amazon Elastic Compute Cloud (Amazon EC2)",
	awsquota.EBSServiceCode: "Amazon Elastic Block Store (Amazon EBS)",
}

// servedQuota is a quota Service Quotas serves: EC2's vCPU quotas (which
// RunInstances and CreateFleet enforce), its dedicated host quotas and
// EBS's storage, IOPS and snapshot quotas (which are reported only).
type servedQuota struct {
	service, code, name string
	// def is the value a fresh account has (GetAWSDefaultServiceQuota).
	def float64
	// vcpu is EC2's vCPU quota it is, if it is one.
	vcpu *awsquota.Quota
}

// servedQuotas lists a service's quotas by code.
func servedQuotas(service string) []servedQuota {
	var out []servedQuota
	switch service {
	case awsquota.ServiceCode:
		defaults := DefaultQuotas()
		for i, q := range awsquota.Quotas {
			out = append(out, servedQuota{service: service, code: q.Code, name: q.Name, def: defaults[q.Code], vcpu: &awsquota.Quotas[i]})
		}
		for _, h := range hostQuotas {
			out = append(out, servedQuota{service: service, code: h.code, name: "Running Dedicated " + h.family + " Hosts", def: h.value})
		}
	case awsquota.EBSServiceCode:
		for typ, vq := range awsquota.VolumeQuotas {
			out = append(out, servedQuota{service: service, code: vq.Storage, name: vq.StorageName, def: ebsStorageTiB[typ]})
			if vq.IOPS != "" {
				out = append(out, servedQuota{service: service, code: vq.IOPS, name: vq.IOPSName, def: ebsIOPS[typ]})
			}
		}
		out = append(out, servedQuota{service: service, code: "L-309BACF6", name: "Snapshots per Region", def: 100000})
	}
	slices.SortFunc(out, func(a, b servedQuota) int { return strings.Compare(a.code, b.code) })
	return out
}

// lookupQuota finds a quota of a service.
func lookupQuota(service, code string) (servedQuota, bool) {
	for _, q := range servedQuotas(service) {
		if q.code == code {
			return q, true
		}
	}
	return servedQuota{}, false
}

// value is the quota's value now: the knob set for its code, else its
// default.
func (q servedQuota) value(k Knobs) float64 {
	if v, set := k.Quotas[q.code]; set {
		return v
	}
	return q.def
}

func (c *Cloud) quotaJSON(q servedQuota, value float64) sqQuota {
	out := sqQuota{ServiceCode: q.service, ServiceName: quotaServices[q.service],
		QuotaArn:  "arn:aws:servicequotas:" + c.region + ":" + c.account + ":" + q.service + "/" + q.code,
		QuotaCode: q.code, QuotaName: q.name, Value: value, Unit: "None", Adjustable: true, QuotaAppliedAtLevel: "ACCOUNT"}
	if q.vcpu != nil {
		class := "Standard/OnDemand"
		if q.vcpu.Spot {
			class = "Standard/Spot"
		}
		out.UsageMetric = map[string]any{"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
			"MetricDimensions":              map[string]string{"Class": class, "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
			"MetricStatisticRecommendation": "Maximum"}
	}
	return out
}

func writeJSONError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.Header().Set("X-Amzn-ErrorType", code)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"__type": code, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (c *Cloud) serveQuotas(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	rid := c.requestID()
	c.mu.Unlock()
	w.Header().Set("X-Amzn-RequestId", rid)
	op, ok := strings.CutPrefix(r.Header.Get("X-Amz-Target"), quotasTargetPrefix)
	if r.Method != http.MethodPost || !ok {
		c.count("servicequotas.unknown")
		writeJSONError(w, http.StatusBadRequest, "UnknownOperationException", "Service Quotas takes POST requests with an X-Amz-Target of "+quotasTargetPrefix+"<Operation>")
		return
	}
	c.count("servicequotas." + op)
	if c.throttled() {
		c.count("throttled")
		writeJSONError(w, http.StatusBadRequest, "TooManyRequestsException", "Rate exceeded")
		return
	}
	var in struct {
		ServiceCode string `json:"ServiceCode"`
		QuotaCode   string `json:"QuotaCode"`
		NextToken   string `json:"NextToken"`
		MaxResults  *int   `json:"MaxResults"`
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err == nil && len(body) > 0 {
		err = json.Unmarshal(body, &in)
	}
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "SerializationException", "The request body is not valid JSON: "+err.Error())
		return
	}
	knobs := c.Knobs()
	noService := func() {
		writeJSONError(w, http.StatusBadRequest, "NoSuchResourceException", "The request failed because the specified service "+in.ServiceCode+" does not exist.")
	}
	switch op {
	case "GetServiceQuota", "GetAWSDefaultServiceQuota":
		if in.ServiceCode == "" || in.QuotaCode == "" {
			writeJSONError(w, http.StatusBadRequest, "ValidationException", "ServiceCode and QuotaCode are required")
			return
		}
		if _, ok := quotaServices[in.ServiceCode]; !ok {
			noService()
			return
		}
		q, ok := lookupQuota(in.ServiceCode, in.QuotaCode)
		if !ok {
			writeJSONError(w, http.StatusBadRequest, "NoSuchResourceException", "The request failed because the specified quota "+in.QuotaCode+" of service "+in.ServiceCode+" does not exist.")
			return
		}
		value := q.def
		if op == "GetServiceQuota" {
			value = q.value(knobs)
		}
		writeJSON(w, http.StatusOK, map[string]any{"Quota": c.quotaJSON(q, value)})
	case "ListServiceQuotas", "ListAWSDefaultServiceQuotas":
		if in.ServiceCode == "" {
			writeJSONError(w, http.StatusBadRequest, "ValidationException", "ServiceCode is required")
			return
		}
		if _, ok := quotaServices[in.ServiceCode]; !ok {
			noService()
			return
		}
		quotas := servedQuotas(in.ServiceCode)
		start, end, next, ok := quotaPage(w, in.NextToken, in.MaxResults, knobs.PageSize, len(quotas))
		if !ok {
			return
		}
		out := []sqQuota{}
		for _, q := range quotas[start:end] {
			value := q.def
			if op == "ListServiceQuotas" {
				value = q.value(knobs)
			}
			out = append(out, c.quotaJSON(q, value))
		}
		resp := map[string]any{"Quotas": out}
		if next != "" {
			resp["NextToken"] = next
		}
		writeJSON(w, http.StatusOK, resp)
	case "ListServices":
		codes := slices.Sorted(maps.Keys(quotaServices))
		start, end, next, ok := quotaPage(w, in.NextToken, in.MaxResults, knobs.PageSize, len(codes))
		if !ok {
			return
		}
		services := []map[string]string{}
		for _, code := range codes[start:end] {
			services = append(services, map[string]string{"ServiceCode": code, "ServiceName": quotaServices[code]})
		}
		resp := map[string]any{"Services": services}
		if next != "" {
			resp["NextToken"] = next
		}
		writeJSON(w, http.StatusOK, resp)
	default:
		writeJSONError(w, http.StatusBadRequest, "UnknownOperationException", "Operation "+op+" is not offered by this cloud")
	}
}

// quotaPage is the part [start, end) of a listing of n items that a call with
// NextToken token and MaxResults maxResults gets (at most 100 items, as
// Service Quotas allows, and at most the cloud's page size), and the token
// of the next page ("" on the last); it answers the call itself when the
// token or MaxResults are not valid.
func quotaPage(w http.ResponseWriter, token string, maxResults *int, pageSize, n int) (start, end int, next string, ok bool) {
	limit := 100
	if maxResults != nil {
		if *maxResults < 1 || *maxResults > 100 {
			writeJSONError(w, http.StatusBadRequest, "ValidationException", "1 validation error detected: Value at 'maxResults' failed to satisfy constraint: Member must have value between 1 and 100")
			return 0, 0, "", false
		}
		limit = *maxResults
	}
	if pageSize > 0 {
		limit = min(limit, pageSize)
	}
	if token != "" {
		i, err := strconv.Atoi(strings.TrimPrefix(token, "q"))
		if err != nil || !strings.HasPrefix(token, "q") || i < 0 || i > n {
			writeJSONError(w, http.StatusBadRequest, "InvalidPaginationTokenException", "Invalid pagination token")
			return 0, 0, "", false
		}
		start = i
	}
	end = min(start+limit, n)
	if end < n {
		next = "q" + strconv.Itoa(end)
	}
	return start, end, next, true
}

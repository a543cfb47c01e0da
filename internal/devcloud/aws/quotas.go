package aws

import (
	"encoding/json"
	"io"
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

func (c *Cloud) quotaJSON(q awsquota.Quota, value float64) sqQuota {
	class := "Standard/OnDemand"
	if q.Spot {
		class = "Standard/Spot"
	}
	return sqQuota{ServiceCode: awsquota.ServiceCode, ServiceName: "Amazon Elastic Compute Cloud (Amazon EC2)",
		QuotaArn:  "arn:aws:servicequotas:" + c.region + ":" + c.account + ":ec2/" + q.Code,
		QuotaCode: q.Code, QuotaName: q.Name, Value: value, Unit: "None", Adjustable: true, QuotaAppliedAtLevel: "ACCOUNT",
		UsageMetric: map[string]any{"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
			"MetricDimensions":              map[string]string{"Class": class, "Resource": "vCPU", "Service": "EC2", "Type": "Resource"},
			"MetricStatisticRecommendation": "Maximum"}}
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
	switch op {
	case "GetServiceQuota", "GetAWSDefaultServiceQuota":
		if in.ServiceCode == "" || in.QuotaCode == "" {
			writeJSONError(w, http.StatusBadRequest, "ValidationException", "ServiceCode and QuotaCode are required")
			return
		}
		q, ok := awsquota.Lookup(in.QuotaCode)
		if in.ServiceCode != awsquota.ServiceCode || !ok {
			writeJSONError(w, http.StatusBadRequest, "NoSuchResourceException", "The request failed because the specified quota "+in.QuotaCode+" of service "+in.ServiceCode+" does not exist.")
			return
		}
		value := DefaultQuotas()[q.Code]
		if op == "GetServiceQuota" {
			if v, set := knobs.Quotas[q.Code]; set {
				value = v
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"Quota": c.quotaJSON(q, value)})
	case "ListServiceQuotas", "ListAWSDefaultServiceQuotas":
		if in.ServiceCode == "" {
			writeJSONError(w, http.StatusBadRequest, "ValidationException", "ServiceCode is required")
			return
		}
		if in.ServiceCode != awsquota.ServiceCode {
			writeJSONError(w, http.StatusBadRequest, "NoSuchResourceException", "The request failed because the specified service "+in.ServiceCode+" does not exist.")
			return
		}
		limit := 100
		if in.MaxResults != nil {
			if *in.MaxResults < 1 || *in.MaxResults > 100 {
				writeJSONError(w, http.StatusBadRequest, "ValidationException", "MaxResults must be from 1 to 100")
				return
			}
			limit = *in.MaxResults
		}
		limit = min(limit, knobs.PageSize)
		quotas := slices.Clone(awsquota.Quotas)
		slices.SortFunc(quotas, func(a, b awsquota.Quota) int { return strings.Compare(a.Code, b.Code) })
		start := 0
		if in.NextToken != "" {
			n, err := strconv.Atoi(strings.TrimPrefix(in.NextToken, "q"))
			if err != nil || !strings.HasPrefix(in.NextToken, "q") || n < 0 || n > len(quotas) {
				writeJSONError(w, http.StatusBadRequest, "InvalidPaginationTokenException", "Invalid pagination token")
				return
			}
			start = n
		}
		end := min(start+limit, len(quotas))
		out := []sqQuota{}
		for _, q := range quotas[start:end] {
			value := DefaultQuotas()[q.Code]
			if v, set := knobs.Quotas[q.Code]; set && op == "ListServiceQuotas" {
				value = v
			}
			out = append(out, c.quotaJSON(q, value))
		}
		resp := map[string]any{"Quotas": out}
		if end < len(quotas) {
			resp["NextToken"] = "q" + strconv.Itoa(end)
		}
		writeJSON(w, http.StatusOK, resp)
	case "ListServices":
		writeJSON(w, http.StatusOK, map[string]any{"Services": []map[string]string{{"ServiceCode": awsquota.ServiceCode, "ServiceName": "Amazon Elastic Compute Cloud (Amazon EC2)"}}})
	default:
		writeJSONError(w, http.StatusBadRequest, "UnknownOperationException", "Operation "+op+" is not offered by this cloud")
	}
}

package bench

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
)

// capacityCounter is a proxy in front of DynamoDB Local that asks every call for
// ReturnConsumedCapacity INDEXES and adds up the units DynamoDB reports, per operation and per
// table and index. DynamoDB Local reports a TransactWriteItems as one item's units per table
// however many items of that table it writes (2.0 for a fold of a hundred items on the
// aggregates table); DynamoDB bills 2 units per KB for each item. So for transactions the
// counter takes, per table, at least 2 units per item of the request (the items here are all
// under 1 KB, as Local's own count of the single items shows). It is how
// the benchmark counts what a request costs in DynamoDB without a line of it in the store: the
// gateway and the aggregator call it as they would call DynamoDB. DynamoDB Local does not check
// request signatures, so rewriting the body after the SDK signed it is harmless here.
type capacityCounter struct {
	URL string // the proxy's endpoint, for KILN_DYNAMODB_ENDPOINT
	srv *httptest.Server

	mu     sync.Mutex
	ops    map[string]opCapacity
	tables map[string]float64 // write units by table, and by "table/index/name" for a global secondary index
}

// opCapacity is what calls of one operation consumed.
type opCapacity struct {
	Calls       int64
	Read, Write float64 // read and write request units
}

func startCapacityCounter(target string) (*capacityCounter, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	c := &capacityCounter{ops: map[string]opCapacity{}, tables: map[string]float64{}}
	c.srv = httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(u)
			askCapacity(r.Out)
		},
		ModifyResponse: c.count,
	})
	c.URL = c.srv.URL
	return c, nil
}

func (c *capacityCounter) close() { c.srv.Close() }

// askCapacity adds ReturnConsumedCapacity INDEXES to a DynamoDB JSON request.
func askCapacity(r *http.Request) {
	if r.Body == nil || !strings.HasPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_") {
		return
	}
	b, err := io.ReadAll(r.Body)
	_ = r.Body.Close()
	var in map[string]json.RawMessage
	if err == nil && json.Unmarshal(b, &in) == nil && in != nil {
		if _, ok := capacityOps[operation(r)]; ok {
			in["ReturnConsumedCapacity"] = json.RawMessage(`"INDEXES"`)
			if nb, err := json.Marshal(in); err == nil {
				b = nb
			}
		}
		if operation(r) == "TransactWriteItems" {
			r.Header.Set(transactItemsHeader, transactItems(in["TransactItems"]))
		}
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	r.ContentLength = int64(len(b))
	r.Header.Set("Content-Length", strconv.Itoa(len(b)))
}

// transactItemsHeader carries, from a request to its response, how many items of each table a
// TransactWriteItems writes ("table=n,table=n"); DynamoDB Local ignores it.
const transactItemsHeader = "X-Kiln-Bench-Transact-Items"

// transactItems counts a TransactWriteItems request's items per table.
func transactItems(raw json.RawMessage) string {
	var items []map[string]struct{ TableName string }
	_ = json.Unmarshal(raw, &items)
	n := map[string]int{}
	for _, it := range items {
		for _, action := range it { // one of Put, Update, Delete, ConditionCheck
			n[action.TableName]++
		}
	}
	var parts []string
	for table, k := range n {
		parts = append(parts, table+"="+strconv.Itoa(k))
	}
	return strings.Join(parts, ",")
}

func operation(r *http.Request) string {
	_, op, _ := strings.Cut(r.Header.Get("X-Amz-Target"), ".")
	return op
}

// consumed is DynamoDB's ConsumedCapacity of one table: in all, and for each of its global
// secondary indexes.
type consumed struct {
	TableName              string
	CapacityUnits          float64
	ReadCapacityUnits      float64
	WriteCapacityUnits     float64
	GlobalSecondaryIndexes map[string]struct{ CapacityUnits float64 }
}

// count reads the ConsumedCapacity of a response (one object, or a list for transactions and
// batches) and adds it to its operation's. A response without one (a failed call) counts as a
// call of no units: DynamoDB bills a failed conditional write one unit, which the report names.
func (c *capacityCounter) count(resp *http.Response) error {
	op := operation(resp.Request)
	if op == "" {
		return nil
	}
	b, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return err
	}
	var out struct {
		ConsumedCapacity json.RawMessage
	}
	_ = json.Unmarshal(b, &out)
	var list []consumed
	if one := (consumed{}); json.Unmarshal(out.ConsumedCapacity, &one) == nil {
		list = []consumed{one}
	} else {
		_ = json.Unmarshal(out.ConsumedCapacity, &list)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.ops[op]
	o.Calls++
	items := map[string]float64{}
	for _, kv := range strings.Split(resp.Request.Header.Get(transactItemsHeader), ",") {
		if table, n, ok := strings.Cut(kv, "="); ok {
			items[table], _ = strconv.ParseFloat(n, 64)
		}
	}
	for _, u := range list {
		r, w := u.ReadCapacityUnits, u.WriteCapacityUnits
		if r == 0 && w == 0 {
			// Only the total: reads and writes are told apart by the operation.
			if capacityOps[op] {
				r = u.CapacityUnits
			} else {
				w = u.CapacityUnits
			}
		}
		o.Read += r
		o.Write += w
		if capacityOps[op] {
			continue // c.tables holds write units
		}
		table := u.CapacityUnits
		for name, ix := range u.GlobalSecondaryIndexes {
			c.tables[u.TableName+"/index/"+name] += ix.CapacityUnits
			table -= ix.CapacityUnits
		}
		if billed := 2 * items[u.TableName]; billed > table {
			o.Write += billed - table
			table = billed
		}
		c.tables[u.TableName] += table
	}
	c.ops[op] = o
	return nil
}

// capacityOps are the operations that can return their consumed capacity, each true when it
// reads (false when it writes).
var capacityOps = map[string]bool{"GetItem": true, "Query": true, "Scan": true, "BatchGetItem": true, "TransactGetItems": true,
	"PutItem": false, "UpdateItem": false, "DeleteItem": false, "BatchWriteItem": false, "TransactWriteItems": false}

// take returns what was counted since the last take, by operation and by table, and starts
// again from zero.
func (c *capacityCounter) take() (map[string]opCapacity, map[string]float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ops, tables := maps.Clone(c.ops), maps.Clone(c.tables)
	clear(c.ops)
	clear(c.tables)
	return ops, tables
}

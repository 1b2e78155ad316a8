package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// lambdaMemorySizes are the gateway function's memory sizes the benchmark compares, in MB.
var lambdaMemorySizes = []int{128, 256, 512, 1024}

// memoryWarmInvocations is how many warm invocations each start of the bootstrap answers in the
// memory comparison, after its cold one.
const memoryWarmInvocations = 10

// maxAddedFirstByteMS is issue 19's bound on what a memory size may add to the first byte of a
// stream: the template's default is the smallest size that adds no more.
const maxAddedFirstByteMS = 20

// lambdaMemory is the bootstrap on DynamoDB at each memory size, its CPU held as Lambda holds a
// function of that size, against the same bootstrap without a limit in the same rounds.
type lambdaMemory struct {
	controller string
	rounds     []memoryRound
	// capacity is what the warm requests of the unlimited starts consumed in DynamoDB, per
	// operation, and requests how many they were.
	capacity map[string]opCapacity
	tables   map[string]float64 // units by table and index, over the same requests
	requests int
	// logBytes and logLines are what the bootstrap wrote to stdout and stderr (its request log
	// and metric lines, which CloudWatch Logs ingests) per warm request.
	logBytes, logLines float64
	// fold is the pipe's messages and the aggregator's fold of the usage records these starts
	// settled.
	fold foldCost
	err  error
}

// memoryRound is one round: a start without a limit and one at each size, in alternating order.
type memoryRound struct {
	free memoryStart
	at   map[int]memoryStart
}

// memoryStart is one start of the bootstrap: its cold invocation, and medians over its warm ones.
type memoryStart struct {
	cold      float64 // ms from exec to the end of the first response
	firstByte float64 // ms from queueing a warm invocation to its first data: event
	whole     float64 // ms from queueing a warm invocation to the end of its response
	throttled float64 // 100 ms periods in which the limit held the process back, per warm invocation
}

// measureLambdaMemory runs the bootstrap in task on DynamoDB Local (through a capacity counter
// in front of dynamoEndpoint) at each of lambdaMemorySizes and without a limit, rounds times,
// each start answering one cold and memoryWarmInvocations warm short streams (16 tokens).
func measureLambdaMemory(st *stack, repo, task, dynamoEndpoint, key string, env []string, rounds int) lambdaMemory {
	m := lambdaMemory{controller: cgroupController(), capacity: map[string]opCapacity{}, tables: map[string]float64{}}
	counter, err := startCapacityCounter(dynamoEndpoint)
	if err != nil {
		m.err = err
		return m
	}
	defer counter.close()
	env = append(append([]string(nil), env...), "KILN_DYNAMODB_ENDPOINT="+counter.URL,
		"KILN_METRICS_NAMESPACE=Kiln/kiln-bench") // as template.yaml sets it: the metric lines are part of the log bill
	event, err := functionURLEvent(repo, key, st.gateway.body(shortStream))
	if err != nil {
		m.err = err
		return m
	}
	sizes := append([]int{0}, lambdaMemorySizes...) // 0: no limit
	var logBytes, logLines float64
	for r := range rounds {
		round := memoryRound{at: map[int]memoryStart{}}
		order := slices.Clone(sizes)
		if r%2 == 1 {
			slices.Reverse(order) // so that drift in the machine's speed hits every size alike
		}
		for _, mb := range order {
			logPath := filepath.Join(st.dir, fmt.Sprintf("memory-lambda-%d-%d.log", mb, r+1))
			s, bytes, lines, err := memoryRun(task, env, mb, event, logPath, counter, &m)
			if err != nil {
				m.err = fmt.Errorf("Lambda bootstrap at %d MB: %w", mb, err)
				return m
			}
			if mb == 0 {
				round.free = s
				logBytes += bytes
				logLines += lines
			} else {
				round.at[mb] = s
			}
		}
		m.rounds = append(m.rounds, round)
	}
	m.logBytes, m.logLines = logBytes/float64(m.requests), logLines/float64(m.requests)
	prefix := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "KILN_TABLE_PREFIX="); ok {
			prefix = v
		}
	}
	m.fold = measureFold(counter, prefix)
	return m
}

// memoryRun is one start at mb (0: no limit). The unlimited start also counts its warm requests'
// DynamoDB capacity and log output into m.
func memoryRun(task string, env []string, mb int, event []byte, logPath string, counter *capacityCounter, m *lambdaMemory) (s memoryStart, logBytes, logLines float64, err error) {
	var limit *cpuLimit
	if mb > 0 {
		// The unlimited start tells the runtime 1,024 MB, the template's size until now.
		env = append(slices.Clone(env), "AWS_LAMBDA_FUNCTION_MEMORY_SIZE="+strconv.Itoa(mb))
		if limit, err = newCPULimit(fmt.Sprintf("kilnbench-%d-%d", os.Getpid(), mb), mb); err != nil {
			return s, 0, 0, err
		}
		defer limit.remove()
	}
	b, err := startBootstrap(task, env, limit, event, logPath)
	if err != nil {
		return s, 0, 0, err
	}
	defer b.stop() // before the cgroup goes: it must be empty
	end, err := b.wait(requestID(1))
	if err != nil {
		return s, 0, 0, err
	}
	s.cold = ms(end.at.Sub(b.started))
	counter.take()
	before, _ := os.ReadFile(logPath)
	var throttled0 int64
	if limit != nil {
		throttled0, _ = limit.throttled()
	}
	var first, whole []float64
	for range memoryWarmInvocations {
		queued, end, err := b.invoke(event)
		if err != nil {
			return s, 0, 0, err
		}
		if end.first.IsZero() {
			return s, 0, 0, fmt.Errorf("a stream without a data: event; its log:\n%s", tail(logPath))
		}
		first = append(first, ms(end.first.Sub(queued)))
		whole = append(whole, ms(end.at.Sub(queued)))
	}
	s.firstByte, s.whole = spread(first).median(), spread(whole).median()
	if limit != nil {
		n, _ := limit.throttled()
		s.throttled = float64(n-throttled0) / memoryWarmInvocations
	}
	if mb == 0 {
		// Settlement ends before the response does, so every warm request's calls are counted.
		ops, tables := counter.take()
		for op, c := range ops {
			t := m.capacity[op]
			t.Calls += c.Calls
			t.Read += c.Read
			t.Write += c.Write
			m.capacity[op] = t
		}
		for name, u := range tables {
			m.tables[name] += u
		}
		m.requests += memoryWarmInvocations
		after, _ := os.ReadFile(logPath)
		grown := after[min(len(before), len(after)):]
		logBytes, logLines = float64(len(grown)), float64(bytes.Count(grown, []byte("\n")))
	}
	return s, logBytes, logLines, nil
}

// added is, per round, what size mb added to f over the unlimited start of the same round.
func (m lambdaMemory) added(mb int, f func(memoryStart) float64) spread {
	return perRound(m.rounds, func(r memoryRound) float64 { return f(r.at[mb]) - f(r.free) })
}

// of is f of size mb (0: the unlimited start), per round.
func (m lambdaMemory) of(mb int, f func(memoryStart) float64) spread {
	return perRound(m.rounds, func(r memoryRound) float64 {
		if mb == 0 {
			return f(r.free)
		}
		return f(r.at[mb])
	})
}

// chosen is the smallest size whose median added first byte is within maxAddedFirstByteMS, or
// 0 when none is.
func (m lambdaMemory) chosen() int {
	for _, mb := range lambdaMemorySizes {
		if len(m.rounds) > 0 && m.added(mb, func(s memoryStart) float64 { return s.firstByte }).median() <= maxAddedFirstByteMS {
			return mb
		}
	}
	return 0
}

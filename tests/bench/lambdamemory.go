package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
)

// lambdaTablePrefix is the prefix of the tables the bootstrap's cold starts and memory
// comparison run on.
const lambdaTablePrefix = "kilnbench-"

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

// memoryRound is one round: a start without a limit (at 0) and one at each size, in
// alternating order.
type memoryRound map[int]memoryStart

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
	env = append(slices.Clone(env), "KILN_DYNAMODB_ENDPOINT="+counter.URL,
		"KILN_METRICS_NAMESPACE=Kiln/kiln-bench") // as template.yaml sets it: the metric lines are part of the log bill
	event, err := functionURLEvent(repo, key, st.gateway.body(shortStream))
	if err != nil {
		m.err = err
		return m
	}
	for r := range rounds {
		round := memoryRound{}
		for _, mb := range alternate(r, append([]int{0}, lambdaMemorySizes...)) { // 0: no limit
			logPath := filepath.Join(st.dir, fmt.Sprintf("memory-lambda-%d-%d.log", mb, r+1))
			if round[mb], err = memoryRun(task, env, mb, event, logPath, counter, &m); err != nil {
				m.err = fmt.Errorf("Lambda bootstrap at %d MB: %w", mb, err)
				return m
			}
		}
		m.rounds = append(m.rounds, round)
	}
	m.logBytes, m.logLines = m.logBytes/float64(m.requests), m.logLines/float64(m.requests)
	m.fold, err = measureFold(counter, lambdaTablePrefix)
	m.fold.err = err
	return m
}

// memoryRun is one start at mb (0: no limit). The unlimited start also adds its warm requests'
// DynamoDB capacity and log output to m.
func memoryRun(task string, env []string, mb int, event []byte, logPath string, counter *capacityCounter, m *lambdaMemory) (s memoryStart, err error) {
	var limit *cpuLimit
	if mb > 0 {
		// The unlimited start tells the runtime 1,024 MB, the template's size until now.
		env = append(slices.Clone(env), "AWS_LAMBDA_FUNCTION_MEMORY_SIZE="+strconv.Itoa(mb))
		if limit, err = newCPULimit(fmt.Sprintf("kilnbench-%d-%d", os.Getpid(), mb), mb); err != nil {
			return s, err
		}
		defer limit.remove()
	}
	b, end, err := startBootstrap(task, env, limit, event, logPath)
	if err != nil {
		return s, err
	}
	defer b.stop() // before the cgroup goes: it must be empty
	s.cold = ms(end.at.Sub(b.started))
	counter.take()
	before, _ := os.ReadFile(logPath)
	throttled0, _ := limit.throttled()
	var first, whole spread
	for range memoryWarmInvocations {
		queued, end, err := b.invoke(event)
		if err != nil {
			return s, err
		}
		if end.first.IsZero() {
			return s, fmt.Errorf("a stream without a data: event; its log:\n%s", tail(logPath))
		}
		first, whole = append(first, ms(end.first.Sub(queued))), append(whole, ms(end.at.Sub(queued)))
	}
	s.firstByte, s.whole = first.median(), whole.median()
	if limit != nil {
		n, _ := limit.throttled()
		s.throttled = float64(n-throttled0) / memoryWarmInvocations
	}
	if mb == 0 {
		// Settlement ends before the response does, so every warm request's calls are counted.
		ops, tables := counter.take()
		for op, c := range ops {
			t := m.capacity[op]
			t.Calls, t.Read, t.Write = t.Calls+c.Calls, t.Read+c.Read, t.Write+c.Write
			m.capacity[op] = t
		}
		for name, u := range tables {
			m.tables[name] += u
		}
		m.requests += memoryWarmInvocations
		after, _ := os.ReadFile(logPath)
		grown := after[min(len(before), len(after)):]
		m.logBytes += float64(len(grown))
		m.logLines += float64(bytes.Count(grown, []byte("\n")))
	}
	return s, nil
}

// added is, per round, what size mb added to f over the unlimited start of the same round.
func (m lambdaMemory) added(mb int, f func(memoryStart) float64) spread {
	return perRound(m.rounds, func(r memoryRound) float64 { return f(r[mb]) - f(r[0]) })
}

// of is f of size mb (0: the unlimited start), per round.
func (m lambdaMemory) of(mb int, f func(memoryStart) float64) spread {
	return perRound(m.rounds, func(r memoryRound) float64 { return f(r[mb]) })
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

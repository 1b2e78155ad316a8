package finance

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/neocloud/kiln/pkg/ddbitem"
)

// Export is what one location holds of DynamoDB exports: one or more exports (a table each),
// each in an export directory (PREFIX/AWSDynamoDB/EXPORT-ID/). With its manifests an export's
// data files are those manifest-files.json names, each checked against its item count and MD5
// checksum; without them (moto writes none), every data file in the directory. Which table an
// export is of is told from its first item (TableOf), so the layout of prefixes does not matter.
type Export struct {
	loc   location
	parts []*part
}

// part is one export directory.
type part struct {
	dir     string   // its key prefix, "" or ending in "/"
	summary *summary // nil without manifests
	files   []dataFile
	table   Table
}

// summary is manifest-summary.json (the fields this reader uses).
type summary struct {
	TableArn     string `json:"tableArn"`
	OutputFormat string `json:"outputFormat"`
	ExportType   string `json:"exportType"`
	ItemCount    *int64 `json:"itemCount"`
}

// fileEntry is one line of manifest-files.json.
type fileEntry struct {
	ItemCount     *int64 `json:"itemCount"`
	MD5Checksum   string `json:"md5Checksum"`
	DataFileS3Key string `json:"dataFileS3Key"`
}

type dataFile struct {
	key   string
	items int64  // from the manifest; -1 unknown
	md5   string // base64, from the manifest; "" unknown
}

// Open finds the exports at where (s3://BUCKET/PREFIX, read with client, or a directory) and
// checks their manifests; it reads the first item of each export to tell its table. Two exports
// of one table at one location are an error: their sums would count every item twice.
func Open(ctx context.Context, where string, client *s3.Client) (*Export, error) {
	loc, err := openLocation(where, client)
	if err != nil {
		return nil, err
	}
	keys, err := loc.list(ctx)
	if err != nil {
		return nil, err
	}
	x := &Export{loc: loc}
	present := make(map[string]bool, len(keys))
	for _, key := range keys {
		present[key] = true
	}
	manifested := map[string]bool{}
	for _, key := range keys {
		if path.Base(key) != "manifest-summary.json" {
			continue
		}
		p, err := x.readManifests(ctx, dirOf(key), present)
		if err != nil {
			return nil, err
		}
		manifested[p.dir] = true
		x.parts = append(x.parts, p)
	}
	bare := map[string]*part{}
	for _, key := range keys {
		if !isDataFile(key) {
			continue
		}
		dir := exportDir(key)
		if underAny(key, manifested) {
			continue // its export's manifest lists its files
		}
		if bare[dir] == nil {
			bare[dir] = &part{dir: dir}
		}
		bare[dir].files = append(bare[dir].files, dataFile{key: key, items: -1})
	}
	for _, dir := range slices.Sorted(maps.Keys(bare)) {
		x.parts = append(x.parts, bare[dir])
	}
	if len(x.parts) == 0 {
		return nil, fmt.Errorf("export %s: no DynamoDB export there (no manifest-summary.json and no data files)", loc)
	}
	seen := map[Table]*part{}
	for _, p := range x.parts {
		if p.table, err = x.firstTable(ctx, p); err != nil {
			return nil, err
		}
		if p.table == Other {
			continue
		}
		if q := seen[p.table]; q != nil {
			return nil, fmt.Errorf("export %s: two exports of the %s table (%s and %s): give the prefix of one of them",
				loc, p.table, x.name(q.dir), x.name(p.dir))
		}
		seen[p.table] = p
	}
	return x, nil
}

// readManifests reads an export directory's manifest-summary.json and manifest-files.json.
func (x *Export) readManifests(ctx context.Context, dir string, present map[string]bool) (*part, error) {
	p := &part{dir: dir, summary: &summary{}}
	if err := x.readJSON(ctx, dir+"manifest-summary.json", p.summary); err != nil {
		return nil, err
	}
	s := p.summary
	switch {
	case s.OutputFormat != "" && s.OutputFormat != "DYNAMODB_JSON":
		return nil, fmt.Errorf("export %s: output format %s; kilnctl reads DYNAMODB_JSON exports (--export-format DYNAMODB_JSON)", x.name(dir), s.OutputFormat)
	case s.ExportType != "" && s.ExportType != "FULL_EXPORT":
		return nil, fmt.Errorf("export %s: %s; kilnctl reads full exports (an incremental export holds changes, not the table)", x.name(dir), s.ExportType)
	}
	filesKey := dir + "manifest-files.json"
	if !present[filesKey] {
		return nil, fmt.Errorf("export %s: manifest-summary.json without manifest-files.json (an export still running, or an incomplete copy)", x.name(dir))
	}
	r, err := x.loc.open(ctx, filesKey)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	var total int64
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e fileEntry
		if err := json.Unmarshal(line, &e); err != nil || e.DataFileS3Key == "" {
			return nil, fmt.Errorf("export %s: manifest-files.json line %d: not a data file entry", x.name(dir), n)
		}
		// The manifest names files by their key in the bucket; the copy here is the same
		// export directory, wherever it lies, so the file is found by its name under data/.
		key := dir + "data/" + path.Base(e.DataFileS3Key)
		if !present[key] {
			return nil, fmt.Errorf("export %s: data file %s is in the manifest but missing", x.name(dir), x.name(key))
		}
		f := dataFile{key: key, items: -1, md5: e.MD5Checksum}
		if e.ItemCount != nil {
			f.items = *e.ItemCount
			total += *e.ItemCount
		}
		p.files = append(p.files, f)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("export %s: read manifest-files.json: %w", x.name(dir), err)
	}
	if s.ItemCount != nil && *s.ItemCount != total {
		return nil, fmt.Errorf("export %s: manifest-summary.json counts %d items, manifest-files.json %d", x.name(dir), *s.ItemCount, total)
	}
	return p, nil
}

func (x *Export) readJSON(ctx context.Context, key string, v any) error {
	r, err := x.loc.open(ctx, key)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(v); err != nil {
		return fmt.Errorf("export %s: %w", x.name(key), err)
	}
	return nil
}

func (x *Export) name(key string) string {
	return strings.TrimSuffix(x.loc.String(), "/") + "/" + key
}

// dirOf is the directory of a key, ending in "/", or "".
func dirOf(key string) string { return key[:strings.LastIndexByte(key, '/')+1] }

// exportDir is the export directory of a data file: what comes before its data/ folder.
func exportDir(key string) string {
	if strings.HasPrefix(key, "data/") {
		return ""
	}
	if i := strings.LastIndex(key, "/data/"); i >= 0 {
		return key[:i+1]
	}
	return dirOf(key)
}

func underAny(key string, dirs map[string]bool) bool {
	for d := range dirs {
		if strings.HasPrefix(key, d) {
			return true
		}
	}
	return false
}

// isDataFile reports whether a key is a data file of an export: DynamoDB writes data/*.json.gz,
// moto data/*.gz; an uncompressed copy may end in .json. Manifests and checksums are not.
func isDataFile(key string) bool {
	base := path.Base(key)
	if strings.HasPrefix(base, "manifest-") || strings.HasPrefix(base, "_") || strings.HasPrefix(base, ".") {
		return false
	}
	return strings.HasSuffix(base, ".gz") || strings.HasSuffix(base, ".json")
}

// errStop ends a read early without an error.
var errStop = errors.New("stop")

// firstTable reads an export's data files up to its first item and tells its table.
func (x *Export) firstTable(ctx context.Context, p *part) (Table, error) {
	t := Other
	for _, f := range p.files {
		err := x.readFile(ctx, f, false, func(it Item) error {
			t = TableOf(it)
			return errStop
		})
		if errors.Is(err, errStop) {
			return t, nil
		}
		if err != nil {
			return Other, err
		}
	}
	// An export of an empty table: its name tells, in the manifest's table ARN or in the
	// prefix (finance export writes each table under PREFIX/<table name>/).
	name := strings.TrimSuffix(strings.TrimSuffix(p.dir, "/"), "/AWSDynamoDB/"+path.Base(strings.TrimSuffix(p.dir, "/")))
	if p.summary != nil && p.summary.TableArn != "" {
		name = p.summary.TableArn
	}
	name = path.Base(name)
	for _, t := range []Table{Ledger, Usage, Aggregates} {
		if strings.HasSuffix(name, t.String()) {
			return t, nil
		}
	}
	return Other, nil
}

// Tables lists which tables the location holds an export of.
func (x *Export) Tables() []Table {
	var ts []Table
	for _, p := range x.parts {
		if p.table != Other {
			ts = append(ts, p.table)
		}
	}
	slices.Sort(ts)
	return ts
}

// Has reports whether the location holds an export of table t.
func (x *Export) Has(t Table) bool { return slices.Contains(x.Tables(), t) }

// Items streams every item of the exports of the given tables to fn, one data file after
// another and one line at a time: memory stays bounded by the longest line, whatever the size
// of the export. Each data file the manifest describes is checked against its item count and
// MD5 checksum as it is read; a mismatch is an error (after fn has seen that file's items).
func (x *Export) Items(ctx context.Context, tables []Table, fn func(Table, Item) error) error {
	for _, p := range x.parts {
		if !slices.Contains(tables, p.table) {
			continue
		}
		for _, f := range p.files {
			if err := x.readFile(ctx, f, true, func(it Item) error { return fn(TableOf(it), it) }); err != nil {
				return err
			}
		}
	}
	return nil
}

// readFile reads one data file, gzipped or not, line by line. With check, the manifest's item
// count and checksum are verified at its end.
func (x *Export) readFile(ctx context.Context, f dataFile, check bool, fn func(Item) error) error {
	r, err := x.loc.open(ctx, f.key)
	if err != nil {
		return err
	}
	defer r.Close()
	var sum hash.Hash
	var src io.Reader = r
	if check && f.md5 != "" {
		sum = md5.New()
		src = io.TeeReader(r, sum)
	}
	br := bufio.NewReaderSize(src, 64<<10)
	var lines io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("data file %s: %w", x.name(f.key), err)
		}
		defer zr.Close()
		lines = zr
	}
	sc := bufio.NewScanner(lines)
	// An item is at most 400 KB; in DynamoDB JSON, with base64 binaries, well under 4 MiB.
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var n int64
	for line := 1; sc.Scan(); line++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		it, err := DecodeLine(sc.Bytes())
		if err != nil {
			return fmt.Errorf("data file %s line %d: %w", x.name(f.key), line, err)
		}
		if it == nil {
			continue
		}
		n++
		if err := fn(it); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("data file %s: %w", x.name(f.key), err)
	}
	if !check {
		return nil
	}
	if f.items >= 0 && n != f.items {
		return fmt.Errorf("data file %s: %d items, the manifest says %d", x.name(f.key), n, f.items)
	}
	if sum != nil {
		io.Copy(io.Discard, br) // the checksum covers the whole object
		if got := base64.StdEncoding.EncodeToString(sum.Sum(nil)); got != f.md5 {
			return fmt.Errorf("data file %s: MD5 %s, the manifest says %s (a damaged copy)", x.name(f.key), got, f.md5)
		}
	}
	return nil
}

// DecodeLine reads one line of a DynamoDB JSON export: {"Item": {...}}. A line that is not that
// shape is an error; an empty line is (nil, nil).
func DecodeLine(line []byte) (Item, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return nil, nil
	}
	var wire struct {
		Item ddbitem.JSONItem `json:"Item"`
	}
	if err := json.Unmarshal(line, &wire); err != nil {
		return nil, fmt.Errorf("not DynamoDB JSON: %w", err)
	}
	if wire.Item == nil {
		return nil, errors.New(`not DynamoDB JSON: no "Item" object`)
	}
	return wire.Item.Item()
}

// String is where the export lies.
func (x *Export) String() string { return x.loc.String() }

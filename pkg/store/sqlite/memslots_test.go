package sqlite

import (
	"slices"
	"strings"
	"testing"
)

// TestMirrorWakesOnlyForADifference: a slot taken arms the mirror's copy; freed again before the
// copy, back to what the leases table holds, it disarms it, so that nothing wakes between short
// requests, whether or not the table holds other slots; a slot the table holds gets its copy of
// the change.
func TestMirrorWakesOnlyForADifference(t *testing.T) {
	m := newMemSlots()
	defer m.copy.Stop()
	const now, expires = 1, 1_000
	if err := m.admit("org-a", "gen-1", 2, 100, 0, now, expires); err != nil {
		t.Fatal(err)
	}
	if !m.armed {
		t.Fatal("a slot taken did not arm the mirror's copy")
	}
	m.release("org-a", "gen-1")
	if m.armed {
		t.Fatal("the slots are back to the empty table's, and the copy is still armed")
	}

	if err := m.admit("org-a", "gen-2", 2, 100, 0, now, expires); err != nil {
		t.Fatal(err)
	}
	m.copied(m.changes()) // the table holds gen-2
	if err := m.admit("org-a", "gen-3", 2, 100, 0, now, expires); err != nil {
		t.Fatal(err)
	}
	m.release("org-a", "gen-3")
	if m.armed {
		t.Fatal("the slots are back to the table's, which holds a slot, and the copy is armed")
	}
	m.release("org-a", "gen-2")
	if !m.armed {
		t.Fatal("a change of a slot the table holds did not arm the copy")
	}
}

// TestMirrorCopiesAChangeMadeDuringACopy: a slot freed while the copy that holds it is written was
// weighed against the table as it was (empty), and disarmed the copy; once the copy is written
// the table holds the slot, so the mirror copies again.
func TestMirrorCopiesAChangeMadeDuringACopy(t *testing.T) {
	m := newMemSlots()
	defer m.copy.Stop()
	const now, expires = 1, 1_000
	if err := m.admit("org-a", "gen-1", 2, 100, 0, now, expires); err != nil {
		t.Fatal(err)
	}
	cs := m.changes() // the mirror starts its copy of gen-1
	if len(cs) != 1 || !cs[0].held {
		t.Fatalf("changes %v", cs)
	}
	m.release("org-a", "gen-1") // meanwhile the slot is freed: the table is still empty
	if m.armed {
		t.Fatal("want the copy disarmed against the empty table (what this test is about)")
	}
	m.copied(cs) // the copy of gen-1 is written
	if !m.armed {
		t.Fatal("the table holds a slot that is free, and no copy is armed to remove it")
	}

	cs = m.changes() // the copy it armed: gen-1 freed
	if len(cs) != 1 || cs[0].held {
		t.Fatalf("second changes %v", cs)
	}
	m.copied(cs) // written: the table is empty, as the slots are
	if m.armed {
		t.Fatal("the table and the slots agree, and a copy is still armed")
	}
}

// TestMirrorCopiesOnlyWhatChanged: the mirror is given the holders changed since its last copy,
// as they are now, not every slot: a renewal among many open streams writes one row, not all.
func TestMirrorCopiesOnlyWhatChanged(t *testing.T) {
	m := newMemSlots()
	defer m.copy.Stop()
	const now, expires = 1, 1_000
	for _, h := range []string{"gen-1", "gen-2", "gen-3"} {
		if err := m.admit("org-a", h, 8, 100, 10, now, expires); err != nil {
			t.Fatal(err)
		}
	}
	cs := m.changes()
	if len(cs) != 3 {
		t.Fatalf("%d changes after three admissions, want 3: %v", len(cs), cs)
	}
	m.copied(cs)
	if err := m.renew("org-a", "gen-2", now, 2_000); err != nil {
		t.Fatal(err)
	}
	m.release("org-a", "gen-3")
	cs = m.changes()
	slices.SortFunc(cs, func(a, b slotChange) int { return strings.Compare(a.holderID, b.holderID) })
	want := []slotChange{
		{holder{"org-a", "gen-2"}, slot{expires: 2_000, reserved: 10}, true},
		{holder: holder{"org-a", "gen-3"}},
	}
	if !slices.Equal(cs, want) {
		t.Fatalf("changes after a renewal and a release %v, want %v", cs, want)
	}
	m.copied(cs)
	if cs := m.changes(); cs != nil {
		t.Fatalf("changes with nothing changed: %v", cs)
	}
}

package sqlite

import "testing"

// TestMirrorWakesOnlyForADifference: a slot taken arms the mirror's copy; freed again before the
// copy, while the leases table holds no slot, it disarms it, so that nothing wakes between
// short requests; a table that holds slots gets its copy of the change.
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

	m.tableEmpty = false // as after a copy of a slot
	if err := m.admit("org-a", "gen-2", 2, 100, 0, now, expires); err != nil {
		t.Fatal(err)
	}
	m.release("org-a", "gen-2")
	if !m.armed {
		t.Fatal("a change while the table holds slots did not arm the copy")
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
	leases, changed := m.snapshot() // the mirror starts its copy of gen-1
	if !changed || len(leases) != 1 {
		t.Fatalf("snapshot %v %v", leases, changed)
	}
	m.release("org-a", "gen-1") // meanwhile the slot is freed: the table is still empty
	if m.armed {
		t.Fatal("want the copy disarmed against the empty table (what this test is about)")
	}
	m.copied(leases) // the copy of gen-1 is written
	if !m.armed {
		t.Fatal("the table holds a slot that is free, and no copy is armed to remove it")
	}

	leases, changed = m.snapshot() // the copy it armed: no slot
	if !changed || len(leases) != 0 {
		t.Fatalf("second snapshot %v %v", leases, changed)
	}
	m.copied(leases) // written: the table is empty, as the slots are
	if m.armed {
		t.Fatal("the table and the slots agree, and a copy is still armed")
	}
}

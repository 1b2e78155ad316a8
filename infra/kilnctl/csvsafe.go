package main

// csvCell makes one CSV cell safe to open in a spreadsheet (contract section 10, after OWASP's
// CSV-injection guidance): a cell that begins with =, +, -, @, a tab or a carriage return would
// run as a formula, so it gets a leading single quote. A plain decimal number stays as it is,
// so that money such as "-1.50" remains a number in a money column.
func csvCell(s string) string {
	if s == "" {
		return s
	}
	switch s[0] {
	case '=', '+', '-', '@', '\t', '\r':
		if plainDecimal(s) {
			return s
		}
		return "'" + s
	}
	return s
}

// plainDecimal reports whether s is an optional minus, digits, and optionally a point and more
// digits: "-1.50", "0.000001155", "12".
func plainDecimal(s string) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	digits := func(t string) bool {
		if t == "" {
			return false
		}
		for i := 0; i < len(t); i++ {
			if t[i] < '0' || t[i] > '9' {
				return false
			}
		}
		return true
	}
	intPart, frac, hasPoint := cut(s, '.')
	if !digits(intPart) {
		return false
	}
	return !hasPoint || digits(frac)
}

func cut(s string, sep byte) (before, after string, found bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == sep {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

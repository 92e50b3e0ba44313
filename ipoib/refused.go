package ipoib

// RefusedError is a Port's refusal of a control-plane request (a QP the
// device will not give, a join the subnet administrator refuses) with a
// named reason, which the shim counts per reason (vifs_refused_<reason>,
// groups_refused_<reason>). Reason is a short snake_case name, e.g.
// "no_qp" or "sa_refused"; Err is the cause. A backend returning a plain
// error is counted under "port_error".
type RefusedError struct {
	Reason string
	Err    error
}

// Error returns the reason and the cause.
func (e *RefusedError) Error() string {
	if e.Err == nil {
		return "ipoib: refused: " + e.Reason
	}
	return "ipoib: refused (" + e.Reason + "): " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *RefusedError) Unwrap() error { return e.Err }

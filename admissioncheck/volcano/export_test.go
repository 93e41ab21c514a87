package volcano

// Exported for the external test that ties these defaults to the check's.
var (
	DefaultRetryMinSeconds = defaultRetryMinSeconds
	DefaultRetryMaxSeconds = defaultRetryMaxSeconds
)

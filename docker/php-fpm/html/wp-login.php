<?php
// A stand-in login form: POSTs here are limited to 10 per 5 minutes per IP.
if ($_SERVER['REQUEST_METHOD'] === 'POST') {
    http_response_code(401);
    echo "wrong password\n";
    return;
}
echo "<form method=post><input name=pwd type=password><button>Log in</button></form>\n";

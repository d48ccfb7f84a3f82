# Writes OUT: web/dashboard.css as the C string dashboard_css (the dashboard serves it from
# the binary: an image needs no web/ folder next to it, and nothing is fetched elsewhere).
file(READ ${WEB_DIR}/dashboard.css text)
string(REPLACE "\\" "\\\\" text "${text}")
string(REPLACE "\"" "\\\"" text "${text}")
string(REPLACE "\n" "\\n\"\n  \"" text "${text}")
file(WRITE ${OUT} "/* Generated from web/ by cmake/embed_web.cmake; do not edit. */\nextern const char dashboard_css[];\nconst char dashboard_css[] =\n  \"${text}\";\n")

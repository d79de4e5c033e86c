/*  brk_egress - a sandbox's egress rules on the broker's side (see brk_egress.h).
 */
#include "brk_egress.h"
#include "sbx_egress.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sbx_msg_t *brk_egress_check (const sbx_msg_t *request, const sbx_strlist_t *allow,
                             const sbx_strlist_t *deny)
{
    char why[512];
    if (sbx_egress_check ("allow", allow->items, allow->count, why, sizeof why) ||
        sbx_egress_check ("deny", deny->items, deny->count, why, sizeof why))
        return sbx_msg_new_error (request->rid, SBX_E_INVALID_ARGUMENT, "%s", why);
    return NULL;
}

char *brk_egress_join (const sbx_strlist_t *list)
{
    size_t size = 1;
    for (size_t i = 0; i < list->count; i++)
        size += strlen (list->items[i]) + 1;
    if (list->count == 0)
        return NULL;
    char *text = malloc (size);
    if (!text)
        return NULL;
    char *at = text;
    for (size_t i = 0; i < list->count; i++) {
        size_t n = strlen (list->items[i]);
        memcpy (at, list->items[i], n);
        at += n;
        *at++ = '\n';
    }
    at[-1] = '\0'; //  no newline after the last
    return text;
}

int brk_egress_split (const char *text, sbx_strlist_t *list)
{
    while (text && *text) {
        const char *end = strchr (text, '\n');
        size_t n = end ? (size_t) (end - text) : strlen (text);
        char *item = strndup (text, n);
        int rc = item ? sbx_strlist_append (list, item) : -1;
        free (item);
        if (rc)
            return -1;
        text = end ? end + 1 : NULL;
    }
    return 0;
}

int brk_egress_copy (const sbx_strlist_t *from, sbx_strlist_t *to)
{
    for (size_t i = 0; i < from->count; i++)
        if (sbx_strlist_append (to, from->items[i]))
            return -1;
    return 0;
}

void brk_egress_test (bool verbose)
{
    if (verbose)
        printf (" * brk_egress: ");
    sbx_strlist_t list = {0};
    assert (brk_egress_join (&list) == NULL);
    assert (brk_egress_split (NULL, &list) == 0 && list.count == 0);
    assert (brk_egress_split ("10.0.0.0/8\nexample.com", &list) == 0 && list.count == 2);
    assert (strcmp (list.items[1], "example.com") == 0);
    sbx_strlist_t copy = {0};
    assert (brk_egress_copy (&list, &copy) == 0 && copy.count == 2);
    assert (strcmp (copy.items[0], "10.0.0.0/8") == 0);
    sbx_strlist_clear (&copy);
    char *text = brk_egress_join (&list);
    assert (text && strcmp (text, "10.0.0.0/8\nexample.com") == 0);
    free (text);

    sbx_msg_t *request = sbx_msg_new (SBX_MSG_SANDBOX_UPDATE);
    request->rid = 7;
    sbx_msg_t *reply;
    sbx_strlist_t none = {0};
    assert (brk_egress_check (request, &list, &none) == NULL); //  names are enforced (vmd)
    sbx_strlist_append (&none, "bad..name");
    reply = brk_egress_check (request, &list, &none);
    assert (reply && reply->type == SBX_MSG_ERROR && reply->rid == 7);
    assert (sbx_msg_error (reply)->code == SBX_E_INVALID_ARGUMENT);
    assert (strstr (sbx_msg_error (reply)->message, "egress.deny[0]"));
    sbx_msg_destroy (&reply);
    sbx_msg_destroy (&request);
    sbx_strlist_clear (&list);
    sbx_strlist_clear (&none);
    if (verbose)
        printf ("OK\n");
}

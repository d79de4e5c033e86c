/*  brk_names - see brk_names.h */
#include "brk_names.h"
#include "sbx_secret.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *s_adjectives[] = {
    "amber",  "ample",  "azure", "bold",  "brave", "brisk",  "bright", "calm",   "clever", "cosmic",
    "crisp",  "deft",   "eager", "early", "fair",  "fancy",  "fast",   "fine",   "fresh",  "gentle",
    "glad",   "golden", "grand", "green", "happy", "hardy",  "honest", "jolly",  "keen",   "kind",
    "light",  "lively", "lucky", "magic", "merry", "mild",   "modest", "neat",   "nimble", "noble",
    "polite", "proud",  "quick", "quiet", "rapid", "ready",  "royal",  "rustic", "sharp",  "shiny",
    "silent", "silver", "smart", "snowy", "solid", "steady", "sunny",  "swift",  "tidy",   "vivid",
    "warm",   "wise",   "witty", "young"};

static const char *s_animals[] = {
    "ant",    "badger", "bat",   "bear",  "beaver", "bee",    "bison", "camel",  "cat",   "cobra",
    "crane",  "crow",   "deer",  "dingo", "dove",   "duck",   "eagle", "eel",    "elk",   "falcon",
    "ferret", "finch",  "fox",   "frog",  "gecko",  "goat",   "goose", "hare",   "hawk",  "heron",
    "horse",  "ibis",   "jay",   "koala", "lemur",  "lion",   "llama", "lynx",   "mole",  "moose",
    "newt",   "otter",  "owl",   "panda", "parrot", "puffin", "quail", "rabbit", "raven", "robin",
    "rook",   "seal",   "shark", "sloth", "snail",  "swan",   "tiger", "toad",   "trout", "viper",
    "walrus", "whale",  "wolf",  "zebra"};

#define S_COUNT(a) ((uint32_t) (sizeof (a) / sizeof (a)[0]))

char *brk_names_label (void)
{
    char *label;
    uint32_t a = sbx_secret_uniform (S_COUNT (s_adjectives));
    uint32_t b = sbx_secret_uniform (S_COUNT (s_adjectives) - 1);
    if (b >= a)
        b++; //  two different adjectives: "calm-calm-owl" reads like a typo
    if (asprintf (&label, "%s-%s-%s", s_adjectives[a], s_adjectives[b],
                  s_animals[sbx_secret_uniform (S_COUNT (s_animals))]) < 0)
        return NULL;
    return label;
}

bool brk_names_dns_safe (const char *text)
{
    size_t len = text ? strlen (text) : 0;
    if (len == 0 || len > 63 || text[0] == '-' || text[len - 1] == '-')
        return false;
    for (const char *p = text; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-'))
            return false;
    return true;
}

void brk_names_test (bool verbose)
{
    (void) verbose;
    for (int i = 0; i < 1000; i++) {
        char *label = brk_names_label ();
        assert (label && brk_names_dns_safe (label));
        //  Three words, the first two different.
        char *first = label, *second = strchr (label, '-') + 1;
        assert (strchr (second, '-'));
        assert (strncmp (first, second, (size_t) (strchr (second, '-') - second)) != 0 ||
                strchr (first, '-') - first != strchr (second, '-') - second);
        free (label);
    }
    assert (brk_names_dns_safe ("a"));
    assert (brk_names_dns_safe ("web-1"));
    assert (!brk_names_dns_safe (""));
    assert (!brk_names_dns_safe ("-a"));
    assert (!brk_names_dns_safe ("a-"));
    assert (!brk_names_dns_safe ("Upper"));
    assert (!brk_names_dns_safe ("a.b"));
    assert (!brk_names_dns_safe (NULL));
    char long_name[70];
    memset (long_name, 'a', 64);
    long_name[64] = 0;
    assert (!brk_names_dns_safe (long_name));
}
